"""Small result files for the report tests: benchmark JSON lines and trainer run directories written
in the formats of benchmarks/common.py emit() and trainer/metrics.py + trainer/train.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def bench_record(name: str, world_size: int, tokens_per_s_per_gpu: float, **extra: Any) -> dict[str, Any]:
    """One emit() record (the keys benchmarks/common.py summarise() writes, on a GPU)."""
    record = {
        "name": name,
        "world_size": world_size,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "mfu": tokens_per_s_per_gpu * 4.6e-5,
        "median_step_time_s": 8192 / tokens_per_s_per_gpu,
        "min_step_time_s": 8000 / tokens_per_s_per_gpu,
        "max_step_time_s": 8400 / tokens_per_s_per_gpu,
        "measured_steps": 8,
        "peak_allocated_gib": 100.5,
        "peak_reserved_gib": 110.0,
        "config": {"model": "llama2-7b", "seq_len": 4096},
        "versions": {"gpu": "NVIDIA H200", "torch": "2.11.0"},
        "command": f"torchrun --nproc_per_node={world_size} benchmarks/train_bench.py --name {name}",
    }
    record.update(extra)
    return record


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


def run_info(
    world_size: int, *, model: str = "tiny", strategy: str = "FULL_SHARD", mesh: dict[str, int] | None = None
) -> dict[str, Any]:
    """The parts of trainer/train.py's run.json the report reads, plus a few it does not."""
    return {
        "config": {
            "model": {"name": model, "path": ""},
            "parallelism": {"sharding_strategy": strategy, "shard_group_size": 0},
            "metrics": {"output_dir": "out", "log_interval_steps": 1},
        },
        "world_size": world_size,
        "local_world_size": world_size,
        "mesh": mesh or {"shard": world_size},
        "device": "cpu",
        "device_name": "cpu",
        "num_params": 139584,
        "total_steps": 10,
        "restart_count": 0,
    }


def step_record(
    step: int,
    world_size: int,
    tokens_per_s_per_gpu: float,
    *,
    restart_count: int = 0,
    mfu: float = 0.0,
    step_time_s: float = 0.1,
    peak_mem_gib: float = 0.7,
) -> dict[str, Any]:
    """One metrics.jsonl line as trainer/metrics.py writes it."""
    return {
        "step": step,
        "loss": 6.0 - 0.1 * step,
        "lr": 0.003,
        "grad_norm": 2.0,
        "tokens": 3700 * step,
        "tokens_per_s": tokens_per_s_per_gpu * world_size,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "mfu": mfu,
        "step_time_s": step_time_s,
        "peak_mem_gib": peak_mem_gib,
        "peak_mem_reserved_gib": peak_mem_gib,
        "padding_fraction": 0.1,
        "loss_tokens": 1200,
        "samples": 8 * step,
        "data_epoch": 0,
        "data_position": 8 * step,
        "restart_count": restart_count,
        "world_size": world_size,
        "time": 1.7e9 + step,
    }


def write_run(
    run_dir: Path,
    world_size: int,
    per_gpu: Sequence[float],
    *,
    info: dict[str, Any] | None = None,
    **record_kwargs: Any,
) -> Path:
    """A trainer run directory: run.json and one logged step per figure of per_gpu (steps 1, 2, ...)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(info or run_info(world_size), indent=2))
    write_jsonl(
        run_dir / "metrics.jsonl", [step_record(i + 1, world_size, t, **record_kwargs) for i, t in enumerate(per_gpu)]
    )
    return run_dir
