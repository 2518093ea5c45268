"""Loading weights: no rank holds a full copy, and every rank reads exactly its own slices.

A 58M-parameter Llama (234 MB in fp32, big enough for resident-set figures to mean something) is
saved with save_pretrained, then the trainer starts from it on 2 ranks with FULL_SHARD. The trainer
reports each rank's peak resident-set growth while materialising and loading (run.json, maximum over
ranks); it must stay below one full fp32 copy. Reading the whole file on a rank, or building the
unsharded model first, would cost at least one full copy.

The run takes one optimizer step with a learning rate of 1e-30 (no weight moves in fp32) and exports
a consolidated checkpoint, which must equal the original file tensor for tensor, bit for bit: the
slices were read from the right offsets and put back together in the right order.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from trainer_support import output_overrides, run

# Loads weights in real torchrun processes.
pytestmark = pytest.mark.slow


def test_load_from_weights_stays_below_one_full_copy_per_rank(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    )
    source = tmp_path / "source"
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            # An exact zero would move by the 1e-30 step; every other value is far above its rounding.
            param[param == 0] = 1e-3
    num_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(source)
    del model
    full_copy = 4 * num_params
    assert 50e6 < num_params < 100e6

    export = tmp_path / "export"
    run(
        [
            *output_overrides(tmp_path),
            f"model.path={source}",
            "data.format=synthetic",
            "data.seq_len=64",
            "data.num_synthetic_samples=16",
            "training.batch_size_per_gpu=1",
            "training.max_steps=1",
            "training.lr=1e-30",
            "training.warmup_steps=0",
            "parallelism.activation_checkpointing=none",
            "checkpoint.dir=",
            f"checkpoint.export_dir={export}",
        ]
    )

    run_info = json.loads((tmp_path / "metrics" / "run.json").read_text())
    assert run_info["num_params"] == num_params
    growth = run_info["load"]["host_peak_delta_bytes_max_rank"]
    # Each rank keeps half the model (its shard) plus one tensor slice in flight.
    assert 0 < growth < full_copy, f"peak growth {growth / 2**20:.0f} MiB vs full copy {full_copy / 2**20:.0f} MiB"
    assert growth < 0.8 * full_copy, f"peak growth {growth / full_copy:.2f} of a full copy"

    original = load_file(source / "model.safetensors")
    exported = load_file(export / "model.safetensors")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        differ = exported[name] != tensor
        assert not differ.any(), (
            f"{name}: {int(differ.sum())} values differ, e.g. {tensor[differ][:3].tolist()} "
            f"-> {exported[name][differ][:3].tolist()}"
        )
