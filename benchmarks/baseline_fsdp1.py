"""Reference: FSDP1 configured like the seed's llama-recipes fine-tuning run, for side-by-side figures.

FULL_SHARD with one FSDP unit per LlamaDecoderLayer (transformer_auto_wrap_policy), bf16
MixedPrecision for parameters, gradient reduction and buffers (llama-recipes' `bfSixteen` policy),
full activation checkpointing (non-reentrant checkpoint_wrapper on every decoder layer), no compile,
plain torch.optim.AdamW, the model's own loss (full logits). Synthetic packed tokens, random init.

    torchrun --nproc_per_node=1 benchmarks/baseline_fsdp1.py --model llama2-7b --seq-len 4096 \
        --batch-size 2 --json /tmp/bench.jsonl
"""

from __future__ import annotations

import functools
import os
import sys

import click
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import emit, summarise, time_steps  # noqa: E402
from trainer.catalog import MODELS, peak_flops_for  # noqa: E402


@click.command()
@click.option("--model", "model_name", default="llama2-7b", type=click.Choice(sorted(MODELS)))
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--batch-size", default=2, show_default=True, help="Sequences per GPU per step.")
@click.option("--warmup", default=3, show_default=True, help="Untimed steps.")
@click.option("--steps", default=10, show_default=True, help="Timed steps.")
@click.option("--json", "json_path", default=None, help="Append the result as a JSON line here.")
def main(model_name: str, seq_len: int, batch_size: int, warmup: int, steps: int, json_path: str | None) -> None:
    """Time the FSDP1 llama-recipes-style reference on synthetic tokens."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    arch = MODELS[model_name]
    torch.manual_seed(0)
    with torch.device("cuda"):
        # attn_implementation is one of PretrainedConfig's keyword arguments, not LlamaConfig's own.
        model = LlamaForCausalLM(LlamaConfig(**{**arch.hf_config(), "attn_implementation": "sdpa"}))
    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    sharded = FSDP(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}),
        mixed_precision=bf16,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.cuda.current_device(),
        limit_all_gathers=True,
        use_orig_params=False,
    )
    apply_activation_checkpointing(
        sharded,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, LlamaDecoderLayer),
    )
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-5, weight_decay=0.0)
    gen = torch.Generator(device="cuda").manual_seed(1 + dist.get_rank())

    def step(_: int) -> None:
        tokens = torch.randint(0, arch.vocab_size, (batch_size, seq_len), device="cuda", generator=gen)
        # The model shifts labels by one position itself, as in llama-recipes.
        loss = sharded(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = time_steps(step, warmup, steps)
    result = summarise(
        name="baseline-fsdp1",
        step_times=times,
        tokens_per_step_per_gpu=batch_size * seq_len,
        flops_per_token=arch.flops_per_token(seq_len),
        peak_flops=peak_flops_for(torch.cuda.get_device_name()),
        config={
            "model": model_name,
            "seq_len": seq_len,
            "batch_size_per_gpu": batch_size,
            "sharding": "FSDP1 FULL_SHARD",
            "activation_checkpointing": "full",
            "compile": False,
            "precision": "bf16 params/reduce/buffers",
            "optimizer": "AdamW (for-each)",
            "loss": "full logits",
        },
    )
    emit(result, json_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
