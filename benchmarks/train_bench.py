"""Throughput of the project's trainer on synthetic packed tokens.

Runs the same code path as trainer/train.py (build_model -> parallelize -> materialize ->
init_random_weights -> build_optimizer -> train_step), on rows of random tokens with every position
trained (no padding), for a named architecture. Warm-up steps (which include torch.compile) are
dropped; the median of the timed optimizer steps gives tokens/s per GPU and MFU.

The configuration is the trainer's defaults (what the generator writes for GPU runs) plus
`--set key.path=value` overrides, exactly as `trainer.train` takes them:

    torchrun --nproc_per_node=1 benchmarks/train_bench.py --model llama2-7b --seq-len 4096 --batch-size 2
    torchrun --nproc_per_node=2 benchmarks/train_bench.py --model llama2-7b --set parallelism.compile=false
"""

from __future__ import annotations

import os
import sys

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.catalog import MODELS  # noqa: E402
from trainer.config import apply_overrides, from_dict, to_dict  # noqa: E402


def bench_config(model: str, seq_len: int, batch_size: int, overrides: tuple[str, ...]):
    """The trainer defaults for `model` on synthetic data, with the benchmark's overrides on top."""
    data = {
        "model": {"name": model},
        "data": {"format": "synthetic", "seq_len": seq_len},
        "training": {"batch_size_per_gpu": batch_size},
    }
    return from_dict(apply_overrides(data, overrides))


@click.command()
@click.option("--model", "model_name", default="llama2-7b", type=click.Choice(sorted(MODELS)))
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--batch-size", default=2, show_default=True, help="Sequences per GPU per micro-step.")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Trainer config override, e.g. parallelism.activation_checkpointing=none (repeatable).",
)
@click.option("--warmup", default=5, show_default=True, help="Untimed steps (compile happens here).")
@click.option("--steps", default=10, show_default=True, help="Timed steps.")
@click.option("--name", default="trainer", show_default=True, help="Label of this configuration.")
@click.option("--json", "json_path", default=None, help="Append the result as a JSON line here.")
@click.option(
    "--profile",
    "profile_steps",
    default=0,
    show_default=True,
    help="After timing, profile this many steps and add where the GPU time went to the result.",
)
def main(
    model_name: str,
    seq_len: int,
    batch_size: int,
    overrides: tuple[str, ...],
    warmup: int,
    steps: int,
    name: str,
    json_path: str | None,
    profile_steps: int,
) -> None:
    """Time the trainer's optimizer step on synthetic tokens."""
    import torch
    import torch.distributed as dist

    from benchmarks.common import build_random_model, emit, profile_breakdown, summarise, time_steps
    from trainer.catalog import peak_flops_for
    from trainer.data import ShardedSampler, SyntheticDataset
    from trainer.optim import build_optimizer, settle_heap, train_step
    from trainer.parallelize import init_distributed
    from trainer.train import DistEnv

    cfg = bench_config(model_name, seq_len, batch_size, overrides)
    env = DistEnv.from_environ()
    device = init_distributed(env.local_rank)
    model, cfg = build_random_model(cfg, model_name, env, device)
    optimizer = build_optimizer(model, cfg.training, device)
    accum = cfg.training.grad_accum_steps
    rows = cfg.training.batch_size_per_gpu * env.world_size * accum * (warmup + steps)
    dataset = SyntheticDataset(rows, seq_len, model.config.vocab_size, cfg.training.seed)
    sampler = ShardedSampler(rows, cfg.training.batch_size_per_gpu, env.rank, env.world_size, cfg.training.seed)
    model.train()

    def step(_: int) -> None:
        batches = [dataset.batch(sampler.next_rows()).to(device) for _ in range(accum)]
        train_step(model, optimizer, batches, cfg.training, env.world_size, cfg.parallelism.grad_sync)

    settle_heap()  # as trainer.train does before its loop
    times = time_steps(step, warmup, steps)
    breakdown = profile_breakdown(step, profile_steps) if profile_steps and device.type == "cuda" else None
    arch = MODELS[model_name]
    resolved = to_dict(cfg)
    config = {
        "model": model_name,
        "seq_len": seq_len,
        "batch_size_per_gpu": batch_size,
        "grad_accum_steps": accum,
        **{f"parallelism.{k}": v for k, v in resolved["parallelism"].items()},
        "training.loss_impl": cfg.training.loss_impl,
        "training.bf16_optimizer_state": cfg.training.bf16_optimizer_state,
        "model.attn_implementation": cfg.model.attn_implementation,
        "overrides": " ".join(overrides) or "(none)",
    }
    result = summarise(
        name=name,
        config=config,
        step_times=times,
        tokens_per_step_per_gpu=batch_size * seq_len * accum,
        flops_per_token=arch.flops_per_token(seq_len),
        peak_flops=peak_flops_for(torch.cuda.get_device_name()) if device.type == "cuda" else 0.0,
    )
    if breakdown:
        result["profile"] = breakdown
        if env.rank == 0:
            times_ms = {k: v for k, v in breakdown.items() if k not in ("top_kernels", "kernel_families")}
            print("  profile (ms per step): " + ", ".join(f"{k} {v:.1f}" for k, v in times_ms.items()))
            top = breakdown["top_kernels"].items()
            print("  top kernels (ms per step): " + "; ".join(f"{n[:70]} {t:.1f}" for n, t in top))
            families = breakdown["kernel_families"].items()
            print("  kernel families (ms per step): " + "; ".join(f"{n} {t:.1f}" for n, t in families))
    emit(result, json_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
