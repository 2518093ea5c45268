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
from typing import Callable

import torch


def versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.version.cuda or "none", "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        try:
            out["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True).stdout.split("\n")[0].strip()
        except (OSError, subprocess.CalledProcessError):
            out["driver"] = "unknown"
    return out


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


def summarise(*, name: str, config: dict, step_times: list[float], tokens_per_step_per_gpu: int,
              flops_per_token: float, peak_flops: float) -> dict:
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
    print(f"  {'median step time (s)':<36} {result['median_step_time_s']:.4f} "
          f"(min {result['min_step_time_s']:.4f}, max {result['max_step_time_s']:.4f}, "
          f"{result['measured_steps']} steps)")
    print(f"  {'tokens/s per GPU':<36} {result['tokens_per_s_per_gpu']:,.0f}")
    print(f"  {'MFU':<36} {100 * result['mfu']:.1f}%")
    if "peak_allocated_gib" in result:
        print(f"  {'peak allocated / reserved':<36} {result['peak_allocated_gib']:.1f} / "
              f"{result['peak_reserved_gib']:.1f} GiB")
    print(f"  {'versions':<36} {json.dumps(result['versions'], sort_keys=True)}")
    print(f"  {'command':<36} {result['command']}", flush=True)
    if json_path:
        with open(json_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result, sort_keys=True) + "\n")
