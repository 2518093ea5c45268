"""fp8 training: the config, the refusal on a GPU without float8 tensor cores, the conversion of the
decoder linears, the memory model, and a real 2-rank torchrun run (gloo, torchao's emulated float8
matmuls) whose loss falls and whose resume is exact."""

from __future__ import annotations

import shutil

import pytest
import torch
from trainer_support import losses_by_step, output_overrides, read_metrics, run

from trainer import fp8
from trainer import train as train_mod
from trainer.catalog import FP8_MIN_COMPUTE_CAPABILITY, INSTANCE_TYPES, MODELS
from trainer.config import ConfigError, from_dict
from trainer.memory import estimate_peak_gib, resolve_auto

FP8 = ["parallelism.precision=fp8", "training.max_steps=12", "checkpoint.interval_steps=6"]


def cfg(**parallelism):
    return from_dict(
        {
            "model": {"name": "llama2-7b"},
            "data": {"format": "synthetic", "seq_len": 4096},
            "training": {"batch_size_per_gpu": 2},
            "parallelism": parallelism,
        }
    )


def test_fp8_all_gather_needs_fp8():
    with pytest.raises(ConfigError) as err:
        cfg(fp8_all_gather=True)
    assert err.value.key == "parallelism.fp8_all_gather"
    assert cfg(precision="fp8", fp8_all_gather=True).parallelism.fp8_all_gather


@pytest.mark.parametrize(
    ("precision", "capability", "refused"),
    [("fp8", (8, 0), True), ("fp8", (8, 6), True), ("fp8", (8, 9), False), ("fp8", (9, 0), False),
     ("fp8", None, False), ("bf16", (8, 0), False)],
)  # fmt: skip
def test_fp8_is_refused_below_sm_8_9_and_emulated_only_without_a_gpu(precision, capability, refused):
    par = cfg(precision=precision).parallelism
    if not refused:
        fp8.check_device(par, "NVIDIA H200" if capability else "cpu", capability)
        return
    with pytest.raises(ConfigError) as err:
        fp8.check_device(par, "NVIDIA A100-SXM4-80GB", capability)
    assert err.value.key == "parallelism.precision"
    assert "NVIDIA A100-SXM4-80GB" in str(err.value) and f"SM {capability[0]}.{capability[1]}" in str(err.value)
    assert str(err.value).endswith("set parallelism.precision: bf16")


def test_the_catalog_knows_which_instance_types_have_float8_tensor_cores():
    capable = {n for n, t in INSTANCE_TYPES.items() if t.compute_capability >= FP8_MIN_COMPUTE_CAPABILITY}
    assert capable == {"p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"}
    assert INSTANCE_TYPES["p4de.24xlarge"].compute_capability == (8, 0)


def test_the_trainer_refuses_fp8_on_an_a100_before_any_gpu_work(tmp_path, monkeypatch, capsys):
    """The trainer's own entry point on a machine whose GPU reports SM 8.0 (what torch.cuda says on an
    A100): one line naming the config file's line, exit status 2, and train() (process group, model,
    GPU memory) never entered."""
    import torch

    config = tmp_path / "train.yaml"
    config.write_text("model: {name: tiny}\ndata: {format: synthetic}\nparallelism:\n  precision: fp8\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA A100-SXM4-80GB")

    def no_training(*args, **kwargs):
        raise AssertionError("train() started although the config was refused")

    monkeypatch.setattr(train_mod, "train", no_training)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    # What the one-process defaults and the allocator setting would write into this process's environment.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert train_mod.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: {config} line 4: parallelism.precision: fp8 needs float8 tensor cores"), err
    assert "NVIDIA A100-SXM4-80GB" in err and "SM 8.0" in err and err.rstrip().endswith("bf16")
    # The same config on an H100-class GPU passes the check and goes on to train.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    with pytest.raises(AssertionError, match="train\\(\\) started"):
        train_mod.main(["--config", str(config)])


@pytest.mark.slow  # torchao conversion and an emulated fp8 step: seconds
def test_decoder_linears_become_float8_and_the_rest_stays():
    from torchao.float8.float8_linear import Float8Linear

    from trainer import model as modeling
    from trainer.parallelize import apply_fp8

    model = modeling.build_model(from_dict({"model": {"name": "tiny"}, "data": {"format": "synthetic"}}).model)
    apply_fp8(model, cfg(precision="fp8").parallelism, "cpu")
    converted = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    # Seven projections per decoder layer (q, k, v, o, gate, up, down), nothing else.
    assert len(converted) == 7 * MODELS["tiny"].num_layers
    assert all(name.startswith("model.layers.") for name in converted)
    assert type(model.lm_head) is torch.nn.Linear


def test_memory_model_counts_fp8_and_deferred_gradient_sync():
    arch = MODELS["llama2-7b"]
    bf16 = estimate_peak_gib(arch, cfg(activation_checkpointing="none"), 2)
    fp8 = estimate_peak_gib(arch, cfg(activation_checkpointing="none", precision="fp8"), 2)
    fp8_ag = estimate_peak_gib(arch, cfg(activation_checkpointing="none", precision="fp8", fp8_all_gather=True), 2)
    fp32 = estimate_peak_gib(arch, cfg(activation_checkpointing="none", precision="fp32"), 2)
    assert fp8 < bf16 < fp32
    # Two gathered decoder layers in 1 byte instead of 2.
    layer = (arch.num_params - arch.num_embedding_params - arch.hidden_size) / arch.num_layers
    assert fp8 - fp8_ag == pytest.approx(2 * layer / 2**30)
    accum = from_dict(
        {
            "model": {"name": "llama2-7b"},
            "data": {"format": "synthetic"},
            "training": {"batch_size_per_gpu": 2, "grad_accum_steps": 4},
            "parallelism": {"activation_checkpointing": "none"},
        }
    )
    last = estimate_peak_gib(arch, accum, 2, grad_sync="last")
    every = estimate_peak_gib(arch, accum, 2, grad_sync="every")
    assert last - every == pytest.approx(arch.num_params * (4 - 4 / 2) / 2**30)
    # auto: one reduction per step where it fits (an H200), a reduction per micro-batch where it does not.
    assert resolve_auto(arch, accum, 2, 140.0).parallelism.grad_sync == "last"
    assert resolve_auto(arch, accum, 2, 80.0).parallelism.grad_sync == "every"


@pytest.mark.slow
def test_fp8_run_under_torchrun_loss_falls_and_resume_is_exact(tmp_path):
    straight = tmp_path / "straight"
    log = run([*output_overrides(straight), *FP8])
    assert "checkpoint:" in log
    reference = losses_by_step(read_metrics(straight))
    assert sorted(reference) == list(range(1, 13))
    assert reference[12] < 0.8 * reference[1], reference
    # A second launch from the step-6 checkpoint redoes steps 7-12 bit for bit.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(straight / "ckpt" / "step-00000006", resumed_dir / "ckpt" / "step-00000006")
    log = run([*output_overrides(resumed_dir), *FP8])
    assert "resumed from" in log and "step-00000006" in log
    resumed = losses_by_step(read_metrics(resumed_dir))
    assert sorted(resumed) == list(range(7, 13))
    assert all(resumed[s] == reference[s] for s in resumed), (resumed, reference)
