"""What a checkpoint costs the trainer: the blocking part of a save, the background write, the load.

Builds the trainer's model and optimizer for a catalog architecture (random init, as train_bench.py),
trains a few steps so the optimizer state exists, then saves through trainer.checkpoint.Checkpointer
into --dir and measures, per rank 0:

- async saves (checkpoint.async_mode=async_with_pinned_mem), --async-saves of them: the time training
  is stopped (state dict, copy into page-locked host memory; the first save also allocates and
  registers those buffers), the background write's time, bytes and GB/s, the training steps run
  while it writes (their median time against the steps before), and the host memory of the staging;
- the load of the last async checkpoint into a fresh optimizer, as a resume does it: seconds, GB/s,
  the GPU memory it peaked at above what it left allocated, and the optimizer moments' dtype after it;
- synchronous saves (async_mode=disabled) with each --threads writer thread count: seconds and GB/s.

Every checkpoint is removed once measured, so the folder needs room for one (a tmpfs such as /dev/shm
takes host memory: one checkpoint there and the pinned staging copy together need twice the state).
--stage-only measures the blocking part alone, without writing (for a state too large to be held
twice in host memory). Results are printed and appended as JSON lines (--json); the fields are
described in benchmarks/reports/2026-12-01-checkpoints.md.

    torchrun --standalone --nproc_per_node=1 benchmarks/checkpoint_bench.py --model llama2-7b \\
        --dir /dev/shm/ckpt --set training.bf16_optimizer_state=true --threads 1,8 --json ckpt.jsonl
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.catalog import MODELS  # noqa: E402


def _fs_type(path: str) -> str:
    """The file system type of the mount holding `path` (from /proc/mounts)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")):
                    if len(parts[1]) > len(best):
                        best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@click.command()
@click.option("--model", "model_name", default="llama2-7b", type=click.Choice(sorted(MODELS)))
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--batch-size", default=2, show_default=True)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Trainer config override (repeatable).")
@click.option("--dir", "target", required=True, help="Checkpoint folder (emptied; say what it is: tmpfs, disk).")
@click.option("--train-steps", default=2, show_default=True, help="Steps before the first save.")
@click.option("--async-saves", default=2, show_default=True, help="Asynchronous saves measured, one after another.")
@click.option("--threads", default="1,8", show_default=True, help="Writer thread counts of the synchronous saves.")
@click.option("--async-threads", default=8, show_default=True, help="Writer threads of the asynchronous saves.")
@click.option("--stage-only", is_flag=True, help="Measure the blocking part of async saves only; no write, no load.")
@click.option("--only-sync", is_flag=True, help="Measure the synchronous saves only.")
@click.option("--skip-load", is_flag=True, help="Do not measure the load.")
@click.option(
    "--no-prepare", is_flag=True, help="Do not allocate the pinned buffers ahead (the first save allocates them)."
)
@click.option("--name", default="checkpoint", show_default=True)
@click.option("--json", "json_path", default=None, help="Append each result as a JSON line here.")
def main(
    model_name: str,
    seq_len: int,
    batch_size: int,
    overrides: tuple[str, ...],
    target: str,
    train_steps: int,
    async_saves: int,
    threads: str,
    async_threads: int,
    stage_only: bool,
    only_sync: bool,
    skip_load: bool,
    no_prepare: bool,
    name: str,
    json_path: str | None,
) -> None:
    """Measure checkpoint saves and loads of the trainer's state."""
    import dataclasses

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from benchmarks.common import build_random_model, versions
    from benchmarks.train_bench import bench_config
    from trainer.checkpoint import Checkpointer, HostStaging
    from trainer.config import to_dict
    from trainer.data import ShardedSampler, SyntheticDataset
    from trainer.optim import build_optimizer, train_step
    from trainer.parallelize import init_distributed
    from trainer.train import DistEnv

    cfg = bench_config(model_name, seq_len, batch_size, overrides)
    env = DistEnv.from_environ()
    device = init_distributed(env.local_rank)
    model, cfg = build_random_model(cfg, model_name, env, device)
    optimizer = build_optimizer(model, cfg.training, device)
    rows = batch_size * env.world_size * 100_000
    dataset = SyntheticDataset(rows, seq_len, model.config.vocab_size, cfg.training.seed)
    sampler = ShardedSampler(rows, batch_size, env.rank, env.world_size, cfg.training.seed)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()

    def step() -> float:
        t0 = time.perf_counter()
        batch = dataset.batch(sampler.next_rows()).to(device)
        train_step(model, optimizer, [batch], cfg.training, env.world_size, cfg.parallelism.grad_sync)
        sync()
        return time.perf_counter() - t0

    for _ in range(train_steps):
        step()
    baseline = [step() for _ in range(3)]
    common = {
        # The configuration as train_bench.py's records name it (readers of benchmarks/results/ key on it).
        "config": {
            "model": model_name,
            "seq_len": seq_len,
            "batch_size_per_gpu": batch_size,
            "training.bf16_optimizer_state": cfg.training.bf16_optimizer_state,
            "overrides": " ".join(overrides) or "(none)",
        },
        "model": model_name,
        "seq_len": seq_len,
        "batch_size_per_gpu": batch_size,
        "world_size": env.world_size,
        "bf16_optimizer_state": cfg.training.bf16_optimizer_state,
        "overrides": " ".join(overrides) or "(none)",
        "dir": target,
        "dir_fs": _fs_type(os.path.dirname(os.path.abspath(target)) if not os.path.exists(target) else target),
        "baseline_step_s": statistics.median(baseline),
        "versions": versions(),
        "command": " ".join(["torchrun", f"--nproc_per_node={env.world_size}", *sys.argv]),
    }
    results: list[dict] = []

    def emit(kind: str, **figures) -> None:
        result = {"name": name, "kind": kind, **figures, **common}
        results.append(result)
        if env.rank == 0:
            shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()}
            print(f"== {kind}: {json.dumps(shown)}", flush=True)
            # The planner reads the save and load records of this file (generators/plan/overheads.py);
            # the preparation of the host buffers is printed only.
            if json_path and kind != "prepare-staging":
                with open(json_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(result, sort_keys=True) + "\n")

    def clean() -> None:
        dist.barrier()
        if env.rank == 0:
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target, exist_ok=True)
        dist.barrier()

    def state_bytes() -> int:
        local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
        total = sum(local(p).numel() * local(p).element_size() for p in model.parameters())
        for per_param in optimizer.state.values():
            total += sum(local(t).numel() * local(t).element_size() for t in per_param.values())
        return total

    def moment_dtypes() -> list[str]:
        return sorted({str(s[k].dtype) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq") if k in s})

    def load(path: str, checkpointer: Checkpointer) -> None:
        """The load, as a resume does it: a fresh optimizer with no state yet."""
        nonlocal optimizer
        saved_dtypes = moment_dtypes()
        del optimizer
        optimizer = build_optimizer(model, cfg.training, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        sync()
        t0 = time.perf_counter()
        checkpointer.load(path, model, optimizer)
        sync()
        load_s = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        after = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
        emit(
            "load",
            load_s=load_s,
            bytes=size,
            read_gb_per_s=size / load_s / 1e9,
            allocated_before_gib=before / 2**30,
            allocated_after_gib=after / 2**30,
            peak_during_load_gib=peak / 2**30,
            transient_gib=(peak - after) / 2**30,
            moment_dtypes_saved=saved_dtypes,
            moment_dtypes_after_load=moment_dtypes(),
        )
        step()  # the resumed state trains

    clean()
    train_state = {"data": sampler.state_dict(), "scheduler": {}, "metrics": {}}
    if stage_only:
        staging = HostStaging(pinned=True)
        rss0 = _rss_bytes()
        for i in range(async_saves):
            sync()
            t0 = time.perf_counter()
            model_sd, optim_sd = get_state_dict(model, optimizer)
            t_sd = time.perf_counter() - t0
            staging.stage({"model": model_sd, "optim": optim_sd})
            emit(
                "async-stage-only",
                save=i + 1,
                blocking_s=time.perf_counter() - t0,
                state_dict_s=t_sd,
                staging_host_bytes=staging.bytes,
                state_bytes=state_bytes(),
                host_rss_growth_bytes=_rss_bytes() - rss0,
                moment_dtypes=moment_dtypes(),
            )
            step()
        staging.close()
        dist.destroy_process_group()
        return

    ckpt_cfg = dataclasses.replace(
        cfg.checkpoint, dir=target, async_mode="async_with_pinned_mem", writer_threads=async_threads, keep_last=1
    )
    checkpointer = Checkpointer(ckpt_cfg, to_dict(cfg))
    rss0 = _rss_bytes()
    path = ""
    if not only_sync and not no_prepare:
        # As trainer.train does after its first step: the buffers are allocated while training goes on.
        t0 = time.perf_counter()
        checkpointer.prepare(model, optimizer)
        during: list[float] = []
        while checkpointer._staging.preparing and len(during) < 500:
            during.append(step())
        checkpointer._staging._take_prepared()
        emit(
            "prepare-staging",
            seconds=time.perf_counter() - t0,
            steps_during=len(during),
            median_step_s_during=statistics.median(during) if during else None,
            staging_host_bytes=checkpointer._staging.bytes,
        )
    for i in range(0 if only_sync else async_saves):
        if i:
            clean()
        sync()
        t0 = time.perf_counter()
        path = checkpointer.save(100 + i, model, optimizer, train_state)
        blocking = time.perf_counter() - t0
        rss = _rss_bytes() - rss0
        during = []
        while checkpointer.in_flight and checkpointer._thread is not None and checkpointer._thread.is_alive():
            during.append(step())
            if len(during) >= 500:
                break
        t_wait = time.perf_counter()
        job = checkpointer.wait()
        assert job is not None
        emit(
            "async-save",
            save=i + 1,
            writer_threads=async_threads,
            blocking_s=blocking,
            write_s=job.write_s,
            waited_after_steps_s=time.perf_counter() - t_wait,
            bytes=job.bytes,
            write_gb_per_s=job.bytes / job.write_s / 1e9,
            staging_host_bytes=checkpointer._staging.bytes,
            host_rss_growth_bytes=rss,
            steps_during_write=len(during),
            median_step_s_during_write=statistics.median(during) if during else None,
            state_bytes=state_bytes(),
        )
    checkpointer._staging.close()  # free the pinned copy before the load and the synchronous saves
    if path and not skip_load:
        load(path, checkpointer)
    checkpointer.close()

    for count in [int(t) for t in threads.split(",") if t]:
        clean()
        sync_cfg = dataclasses.replace(ckpt_cfg, async_mode="disabled", writer_threads=count)
        sync_checkpointer = Checkpointer(sync_cfg, to_dict(cfg))
        t0 = time.perf_counter()
        rss = _rss_bytes()
        sync_checkpointer.save(200 + count, model, optimizer, train_state)
        seconds = time.perf_counter() - t0
        job = sync_checkpointer.last
        sync_checkpointer.close()
        assert job is not None
        # DCP copies every tensor to host memory for the write and keeps the copies until the file is
        # done (one copy of the state in all); with one thread they are page-locked blocks that
        # torch's host allocator caches afterwards: hand them back before the next measurement.
        held = _rss_bytes() - rss
        if device.type == "cuda":
            torch._C._host_emptyCache()
        emit(
            "sync-save",
            writer_threads=count,
            blocking_s=seconds,
            write_s=job.write_s,
            bytes=job.bytes,
            write_gb_per_s=job.bytes / job.write_s / 1e9,
            host_rss_growth_after_bytes=held,
        )
    clean()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
