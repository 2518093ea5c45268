"""Shared measurement code for the trainer benchmarks (timing, figures, versions, output).

A benchmark drops its warm-up (and compile) steps, times every later optimizer step with a device
synchronisation on each side, and reports the median. Figures are printed as a table and written as
one JSON object (--json) so that suite.py and generators/report.py can put runs side by side.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch


def versions() -> dict:
    import transformers

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda or "none",
        "python": sys.version.split()[0],
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        try:
            out["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.split("\n")[0]
                .strip()
            )
        except (OSError, subprocess.CalledProcessError):
            out["driver"] = "unknown"
    return out


def build_random_model(cfg, model_name: str, env, device):
    """The trainer's model setup for a randomly initialised catalog model, as trainer.train does it:
    build on the meta device, resolve `auto` checkpointing, shard, materialise, initialise.
    Returns (model, cfg with the checkpointing mode resolved)."""
    from trainer import model as modeling
    from trainer.catalog import MODELS
    from trainer.parallelize import build_mesh, parallelize, resolve_checkpointing

    model = modeling.build_model(cfg.model)
    cfg = resolve_checkpointing(cfg, MODELS[model_name], env.world_size, env.local_world_size, device)
    mesh = build_mesh(cfg.parallelism, env.world_size, env.local_world_size, device.type)
    parallelize(model, cfg.parallelism, mesh)
    modeling.materialize(model, device)
    modeling.init_random_weights(model, cfg.model.init_seed)
    return model, cfg


def time_steps(step: Callable[[int], None], num_warmup: int, num_steps: int) -> list[float]:
    """Run warm-up steps untimed, then return the wall time of each measured step in seconds."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for i in range(num_warmup):
        step(i)
    sync()
    times = []
    for i in range(num_steps):
        t0 = time.perf_counter()
        step(num_warmup + i)
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two unions of disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def breakdown_from_kernels(kernels: list[tuple[str, float, float]], wall: float, num_steps: int) -> dict:
    """Milliseconds per step from GPU kernels (name, start, end in microseconds) over `wall` microseconds:
    compute (non-communication kernels, optimizer included), attention (the fused attention kernels:
    flash, cuDNN or memory-efficient), optimizer (its kernels alone), communication
    (NCCL kernels), communication exposed (NCCL time with no compute kernel running), idle (no kernel)."""
    comm = _union([(s, e) for n, s, e in kernels if "nccl" in n.lower()])
    compute = _union([(s, e) for n, s, e in kernels if "nccl" not in n.lower()])
    optim = _union(
        [
            (s, e)
            for n, s, e in kernels
            if "nccl" not in n.lower() and any(k in n.lower() for k in ("adam", "multi_tensor", "foreach"))
        ]
    )
    attention = _union(
        [(s, e) for n, s, e in kernels if any(k in n.lower() for k in ("flash", "fmha", "cudnn", "attention"))]
    )
    busy = _length(_union(comm + compute))
    ms = lambda us: us / 1000 / num_steps  # noqa: E731
    return {
        "step": ms(wall),
        "compute": ms(_length(compute)),
        "attention": ms(_length(attention)),
        "optimizer": ms(_length(optim)),
        "communication": ms(_length(comm)),
        "communication_exposed": ms(_length(comm) - _overlap(comm, compute)),
        "idle": ms(wall - busy),
    }


def profile_breakdown(step: Callable[[int], None], num_steps: int) -> dict:
    """Run num_steps more steps under torch.profiler; where the GPU time of rank 0 went, per step, and
    the kernels that took most of it (`top_kernels`)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(num_steps):
            step(10_000 + i)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e6
    kernels = [
        (e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    totals: dict[str, float] = {}
    for n, s, e in kernels:
        totals[n] = totals.get(n, 0.0) + e - s
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:12]
    families: dict[str, float] = {}
    for n, t in totals.items():
        families[kernel_family(n)] = families.get(kernel_family(n), 0.0) + t / 1000 / num_steps
    # The twelve kernels that took the most GPU time, and every family's sum, in milliseconds per step.
    return {
        **breakdown_from_kernels(kernels, wall, num_steps),
        "top_kernels": {n: t / 1000 / num_steps for n, t in top},
        "kernel_families": dict(sorted(families.items(), key=lambda kv: -kv[1])),
    }


# A kernel's family by its name, first match wins: what a step's GPU time is spent on, beyond the
# breakdown's overlapping categories (on one GPU FSDP runs no collective: its gathers and reductions
# are the copies and casts).
_FAMILIES = (
    ("nccl", ("nccl",)),
    ("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk")),
    ("inductor (fused elementwise, norms, loss)", ("triton",)),
    ("copy and cast", ("copy", "memcpy", "cat", "split", "memset", "fill")),
    ("reduction", ("reduce",)),
)


def kernel_family(name: str) -> str:
    """The family (_FAMILIES) of a GPU kernel's name; "other elementwise" when none matches."""
    low = name.lower()
    for family, keys in _FAMILIES:
        if any(k in low for k in keys):
            return family
    return "other elementwise"


def summarise(
    *,
    name: str,
    config: dict,
    step_times: list[float],
    tokens_per_step_per_gpu: int,
    flops_per_token: float,
    peak_flops: float,
) -> dict:
    median = statistics.median(step_times)
    tps_gpu = tokens_per_step_per_gpu / median
    result = {
        "name": name,
        "config": config,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        # torchrun agents of the job (--nnodes); GROUP_WORLD_SIZE is torchrun's name for it.
        "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "measured_steps": len(step_times),
        "median_step_time_s": median,
        "min_step_time_s": min(step_times),
        "max_step_time_s": max(step_times),
        "mean_step_time_s": statistics.fmean(step_times),
        "step_times_s": step_times,
        "tokens_per_s_per_gpu": tps_gpu,
        "mfu": tps_gpu * flops_per_token / peak_flops if peak_flops else 0.0,
        "versions": versions(),
        "command": " ".join(shlex.quote(a) for a in shlex.split(os.environ.get("BENCH_LAUNCHER", "python")) + sys.argv),
    }
    if torch.cuda.is_available():
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return result


def emit(result: dict, json_path: str | None) -> None:
    """Print the figures (rank 0 only) and append them as one JSON line to json_path."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print(f"== {result['name']}")
    for key, value in result["config"].items():
        print(f"  {key:<36} {value}")
    print(f"  {'world size':<36} {result['world_size']}")
    print(
        f"  {'median step time (s)':<36} {result['median_step_time_s']:.4f} "
        f"(mean {result['mean_step_time_s']:.4f}, min {result['min_step_time_s']:.4f}, "
        f"max {result['max_step_time_s']:.4f}, "
        f"{result['measured_steps']} steps)"
    )
    print(f"  {'tokens/s per GPU':<36} {result['tokens_per_s_per_gpu']:,.0f}")
    print(f"  {'MFU':<36} {100 * result['mfu']:.1f}%")
    if "peak_allocated_gib" in result:
        print(
            f"  {'peak allocated / reserved':<36} {result['peak_allocated_gib']:.1f} / "
            f"{result['peak_reserved_gib']:.1f} GiB"
        )
    print(f"  {'versions':<36} {json.dumps(result['versions'], sort_keys=True)}")
    print(f"  {'command':<36} {result['command']}", flush=True)
    if json_path:
        with open(json_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result, sort_keys=True) + "\n")
