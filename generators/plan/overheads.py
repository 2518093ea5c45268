"""What a run spends besides its training steps, each a named term with its assumption and source.

Per run, in seconds (P parameters, S the shard group, W the world size; GB = 10^9 bytes):

start         POD_START_S (scheduling, a GPU node's launch and join, the device plugins) plus the
              trainer image pulled onto each node (the nodes pull at once): IMAGE_GB at
              IMAGE_PULL_GB_S, or IMAGE_WRITES x IMAGE_GB at the root volume's provisioned throughput
              (GPU_ROOT_VOLUME_MIB_S) where that is slower (image_pull_s). Assumptions: not measured here.
model load    the weights (2 P bytes of bf16 safetensors) downloaded from the Hugging Face hub once
              per cluster into the shared volume's cache, at HF_DOWNLOAD_GB_S, by the first run of
              the model on the cluster (matrix order); then every run reads them: each rank its rows
              of its shard group's share, 2 P / S bytes at the measured checkpoint load rate, and
              the volume serves 2 P x W / S in all at its throughput. A model without weights (random
              initialisation) loads nothing.
data staging  a dataset on the shared volume (data.path under /shared/data/) is staged once per
              cluster by its staging Job, which the first run's pods wait for: STAGING_JOB_S for the
              Job's pod, plus the dataset's text (BYTES_PER_TOKEN per token) at HF_DOWNLOAD_GB_S.
saves         the part of each interval save that stops training, times the saves before the end,
              (steps - 1) // interval_steps. A save writes the fp32 parameters and AdamW moments, 12 P
              bytes (8 P with bf16 moments), each rank 1/S of it; writing takes the longer of a rank's
              share at the rate measured with the run's checkpoint.writer_threads (the most threads
              measured, not above the run's) and the whole at the shared volume's throughput.
              Synchronous (checkpoint.async_mode disabled): training waits for all of it.
              Asynchronous: training waits while the rank's share is copied into host memory (the
              measured staging rate), and for a previous save still being written when the next one
              starts (the write less the steps between saves).
final save    the last save, which the run waits for to the end of its write, plus the consolidated
and export    export (2 P bytes written by one rank) where checkpoint.export_dir is set.

The checkpoint rates come from benchmarks/results/h200x1-checkpoint.jsonl (CHECKPOINT_RESULTS, the
JSON lines of benchmarks/checkpoint_bench.py: the median of each kind of record and thread count)
once it exists; until then from the synchronous save measured on one H200 (SYNC_SAVE_*), and an
asynchronous save counts as a synchronous one. The shared
volume's throughput is FSx for Lustre PERSISTENT_2 at FSX_MB_S_PER_TIB per TiB of the cluster's
shared_storage_gib (the sizing generators/render/runs.py gives the graceful stop).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generators.core.errors import InputError
from trainer.catalog import Architecture
from trainer.config import TrainConfig

GB = 1e9
GIB = 1024**3
REPO = Path(__file__).resolve().parents[2]

# start: assumptions, not measured here.
POD_START_S = 300.0
POD_START_SOURCE = (
    "an assumption: scheduling, a GPU node's launch and join and its device plugins, about 5 minutes; not measured"
)
IMAGE_GB = 12.0
IMAGE_PULL_GB_S = 0.2
# The GPU nodes' root volume, where containerd keeps images (generators/render/provisioning.py
# provisions it so): gp3 with this throughput and IOPS instead of gp3's default 125 MiB/s and 3,000 IOPS,
# at which writing the pulled layers and their unpacked copy took longer than the pull itself.
GPU_ROOT_VOLUME_MIB_S = 1000
GPU_ROOT_VOLUME_IOPS = 16000
GP3_DEFAULT_MIB_S = 125
# containerd writes each layer twice: the compressed blob into its content store and the unpacked files
# into the snapshot (the unpacked size counted for both, a bound).
IMAGE_WRITES = 2.0
IMAGE_SOURCE = (
    "an assumption: the trainer image (CUDA 13 user space, torch 2.11 with its CUDA libraries, the EFA stack) "
    f"about 12 GB, pulled from ECR at 0.2 GB/s per node and written twice by containerd to the node's gp3 root "
    f"volume at {GPU_ROOT_VOLUME_MIB_S} MiB/s, whichever is slower; not measured"
)


def image_pull_s(volume_mib_s: float = GPU_ROOT_VOLUME_MIB_S) -> float:
    """Seconds to pull the trainer image onto a node whose root volume writes `volume_mib_s`: the slower of
    the registry's rate and containerd's writes."""
    disk_gb_s = volume_mib_s * 1024**2 / GB
    return max(IMAGE_GB / IMAGE_PULL_GB_S, IMAGE_WRITES * IMAGE_GB / disk_gb_s)


# model load and data staging.
HF_DOWNLOAD_GB_S = 0.1
HF_SOURCE = "an assumption: the Hugging Face hub at 0.1 GB/s into the shared volume; not measured"
STAGING_JOB_S = 120.0
BYTES_PER_TOKEN = 4.0
STAGING_SOURCE = (
    "an assumption: the staging Job's pod 2 minutes, the dataset's text about 4 bytes per token at the hub's rate"
)
SHARED_DATA_ROOT = "/shared/data/"
# The shared volume: FSx for Lustre PERSISTENT_2 at 250 MB/s per TiB (generators/render/runs.py).
FSX_MB_S_PER_TIB = 250.0
FSX_SOURCE = (
    "FSx for Lustre PERSISTENT_2 at 250 MB/s per TiB of the cluster's shared_storage_gib, as generators/render/runs.py "
    "sizes the graceful stop; not measured"
)
# Checkpoint rates until CHECKPOINT_RESULTS exists: one synchronous save measured on one H200
# (Llama-2-7B, bf16 AdamW moments, 56 GB of state written to tmpfs so that no disk enters it) took
# 81.6 s and, measured again, 117.5 s: 0.48-0.69 GB/s. The slower one is counted; loading was not
# measured with it and is counted at the same rate.
SYNC_SAVE_STATE_GB = 56.0
SYNC_SAVE_S = 117.5
SYNC_SAVE_GB_S = SYNC_SAVE_STATE_GB / SYNC_SAVE_S
SYNC_SAVE_SOURCE = (
    "the synchronous save measured on one H200 (Llama-2-7B, 56 GB of state to tmpfs in 81.6 s and 117.5 s, "
    "0.48-0.69 GB/s; the slower counted); loading not measured, counted at the same rate"
)
CHECKPOINT_RESULTS = "benchmarks/results/h200x1-checkpoint.jsonl"
# The records of benchmarks/checkpoint_bench.py, by "kind", and the keys the planner reads of each.
RECORD_KEYS = {
    "sync-save": ("writer_threads", "bytes", "blocking_s"),  # training waits for the whole save
    "async-save": ("writer_threads", "state_bytes", "blocking_s", "bytes", "write_s"),  # copy, then write
    "async-stage-only": ("state_bytes", "blocking_s"),  # the copy alone
    "load": ("bytes", "load_s"),
}
ASYNC_MODES = ("async", "async_with_pinned_mem")


def _by_threads(rates: dict[int, float], threads: int) -> float:
    """The rate measured with the most writer threads not above `threads` (fewer threads write no
    faster), else with the fewest measured."""
    fitting = [t for t in rates if t <= threads]
    return rates[max(fitting)] if fitting else rates[min(rates)]


@dataclass(frozen=True, kw_only=True)
class CheckpointRates:
    """Per-rank rates in GB/s by writer threads, with where they come from."""

    sync_gb_s: dict[int, float]  # a synchronous save, all of which training waits for
    write_gb_s: dict[int, float]  # an asynchronous save's background write (empty: not measured)
    load_gb_s: float
    stage_gb_s: float | None  # an asynchronous save's blocking copy into host memory; None: not measured
    source: str
    measured: bool  # read from CHECKPOINT_RESULTS

    def sync_rate(self, threads: int) -> float:
        return _by_threads(self.sync_gb_s, threads)

    def write_rate(self, threads: int) -> float:
        return _by_threads(self.write_gb_s or self.sync_gb_s, threads)


FALLBACK_RATES = CheckpointRates(
    sync_gb_s={1: SYNC_SAVE_GB_S},
    write_gb_s={},
    load_gb_s=SYNC_SAVE_GB_S,
    stage_gb_s=None,
    source=SYNC_SAVE_SOURCE,
    measured=False,
)


def _positive(record: dict[str, Any], key: str, file: str, line: int) -> float:
    value: Any = record.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or not math.isfinite(value):
        raise InputError(
            f"must be a positive number, got {value!r}",
            file=file,
            line=line,
            key=key,
            fix="record it with benchmarks/checkpoint_bench.py",
        )
    return float(value)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def read_checkpoint_rates(path: Path | None = None) -> CheckpointRates:
    """The rates of CHECKPOINT_RESULTS (benchmarks/checkpoint_bench.py's JSON lines), or FALLBACK_RATES
    while that file does not exist. The median of the records of each kind and thread count (the
    first asynchronous save also allocates its host buffers). A record of an unknown kind or without
    a figure the planner reads is bad input naming the file, line and key."""
    path = path if path is not None else REPO / CHECKPOINT_RESULTS
    if not path.exists():
        return FALLBACK_RATES
    file = CHECKPOINT_RESULTS if path == REPO / CHECKPOINT_RESULTS else str(path)
    sync: dict[int, list[float]] = {}
    write: dict[int, list[float]] = {}
    stage: list[float] = []
    load: list[float] = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"not JSON ({err.msg})", file=file, line=number, fix="one JSON object per line") from None
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind not in RECORD_KEYS:
            raise InputError(
                f"unknown record kind {kind!r}",
                file=file,
                line=number,
                key="kind",
                fix=f"one of {', '.join(RECORD_KEYS)} (benchmarks/checkpoint_bench.py)",
            )
        v = {key: _positive(record, key, file, number) for key in RECORD_KEYS[kind]}
        if kind == "sync-save":
            sync.setdefault(int(v["writer_threads"]), []).append(v["bytes"] / GB / v["blocking_s"])
        elif kind == "async-save":
            write.setdefault(int(v["writer_threads"]), []).append(v["bytes"] / GB / v["write_s"])
            stage.append(v["state_bytes"] / GB / v["blocking_s"])
        elif kind == "async-stage-only":
            stage.append(v["state_bytes"] / GB / v["blocking_s"])
        else:
            load.append(v["bytes"] / GB / v["load_s"])
    if not sync and not write:
        raise InputError(
            "holds no save with its write (kind sync-save or async-save)",
            file=file,
            fix="record the saves with benchmarks/checkpoint_bench.py",
        )
    sync_gb_s = {t: _median(r) for t, r in sync.items()}
    write_gb_s = {t: _median(r) for t, r in write.items()}
    slowest_write = min([*sync_gb_s.values(), *write_gb_s.values()])
    load_gb_s = _median(load) if load else slowest_write

    def listed(rates: dict[int, float]) -> str:
        return ", ".join(f"{r:.2f} GB/s with {t} thread{'s' if t > 1 else ''}" for t, r in sorted(rates.items()))

    parts = [
        f"synchronous save {listed(sync_gb_s)}" if sync_gb_s else "",
        f"background write {listed(write_gb_s)}" if write_gb_s else "",
        f"asynchronous copy {_median(stage):.1f} GB/s" if stage else "",
        f"load {load_gb_s:.2f} GB/s" if load else "load not measured, counted at the slowest write",
    ]
    return CheckpointRates(
        sync_gb_s=sync_gb_s or write_gb_s,
        write_gb_s=write_gb_s,
        load_gb_s=load_gb_s,
        stage_gb_s=_median(stage) if stage else None,
        source=f"{file} per rank: " + "; ".join(p for p in parts if p),
        measured=True,
    )


def shared_volume_gb_s(shared_storage_gib: int) -> float:
    return shared_storage_gib / 1024 * FSX_MB_S_PER_TIB * 1e6 / GB


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """Seconds a run spends besides its training steps, by term."""

    start_s: float
    model_load_s: float
    staging_s: float
    saves: int  # interval saves before the end
    save_blocking_s: float  # each
    final_s: float  # the final save and the export

    @property
    def saves_s(self) -> float:
        return self.saves * self.save_blocking_s

    @property
    def total_s(self) -> float:
        return self.start_s + self.model_load_s + self.staging_s + self.saves_s + self.final_s


def async_mode(cfg: TrainConfig) -> str:
    """The run's checkpoint.async_mode ("disabled" where the trainer has no such setting)."""
    return str(getattr(cfg.checkpoint, "async_mode", "disabled"))


def overheads(
    arch: Architecture,
    cfg: TrainConfig,
    *,
    world: int,
    shard: int,
    step_s: float,
    steps: int,
    shared_storage_gib: int,
    downloads_model: bool,
    stages_data: bool,
    dataset_tokens: int | None,
    rates: CheckpointRates,
) -> Overheads:
    """The terms of one run; `downloads_model` / `stages_data`: the run is the first of its cluster to
    need the model's weights / its dataset."""
    volume = shared_volume_gb_s(shared_storage_gib)
    weights_gb = 2 * arch.num_params / GB
    start = POD_START_S + image_pull_s()
    load = 0.0
    if cfg.model.path:
        load = max(weights_gb / shard / rates.load_gb_s, weights_gb * (world // shard) / volume)
        if downloads_model:
            load += weights_gb / HF_DOWNLOAD_GB_S
    staging = 0.0
    if stages_data and cfg.data.format != "synthetic" and cfg.data.path.startswith(SHARED_DATA_ROOT):
        staging = STAGING_JOB_S + (dataset_tokens or 0) * BYTES_PER_TOKEN / GB / HF_DOWNLOAD_GB_S
    saves, blocking, final = 0, 0.0, 0.0
    if cfg.checkpoint.dir:
        state_gb = arch.num_params * (4 + (4 if cfg.training.bf16_optimizer_state else 8)) / GB
        threads = int(getattr(cfg.checkpoint, "writer_threads", 1))
        synchronous = max(state_gb / shard / rates.sync_rate(threads), state_gb / volume)
        interval = cfg.checkpoint.interval_steps
        saves = (steps - 1) // interval if interval and steps else 0
        if async_mode(cfg) in ASYNC_MODES and rates.stage_gb_s is not None:
            write = max(state_gb / shard / rates.write_rate(threads), state_gb / volume)
            copy = state_gb / shard / rates.stage_gb_s
            blocking = copy + max(0.0, write - interval * step_s)
            final = copy + write
        else:
            blocking = final = synchronous
        if cfg.checkpoint.export_dir:
            final += max(weights_gb / rates.sync_rate(1), weights_gb / volume)
    return Overheads(
        start_s=start, model_load_s=load, staging_s=staging, saves=saves, save_blocking_s=blocking, final_s=final
    )


def notes(rates: CheckpointRates, async_runs: bool) -> list[str]:
    """The assumptions and sources of the terms, once each, for the plan."""
    out = [
        f"Start: {POD_START_S / 60:g} minutes ({POD_START_SOURCE}) plus the image pull ({IMAGE_SOURCE}).",
        f"Model load: the weights downloaded once per cluster by the first run of the model ({HF_SOURCE}), then "
        f"read by every run at the checkpoint load rate and the shared volume's throughput ({FSX_SOURCE}).",
        f"Data staging: once per cluster and dataset, counted on its first run ({STAGING_SOURCE}).",
        "Saves: the blocking part of each interval save times the saves before the end; final save: the last save "
        "and any export, waited for in full. Checkpoint rates: "
        + (rates.source if rates.measured else f"{rates.source}; {CHECKPOINT_RESULTS} not recorded yet")
        + ".",
    ]
    if async_runs and rates.stage_gb_s is None:
        out.append(
            "Asynchronous saves: their blocking copy into host memory is not measured yet, so they count as "
            "synchronous saves."
        )
    return out
