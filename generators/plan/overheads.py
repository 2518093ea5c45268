"""What a run spends besides its training steps, each a named term with its assumption and source.

Per run, in seconds (P parameters, S the shard group, W the world size; GB = 10^9 bytes):

start         POD_START_S (scheduling, a GPU node's launch and join, the device plugins) plus the
              trainer image pulled onto each node, IMAGE_GB at IMAGE_PULL_GB_S (the nodes pull at
              once). Assumptions: not measured here.
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
              share at the measured write rate and the whole at the shared volume's throughput.
              Synchronous (checkpoint.async_mode disabled): training waits for all of it.
              Asynchronous: training waits while the rank's share is copied into host memory (the
              measured staging rate), and for a previous save still being written when the next one
              starts (the write less the steps between saves).
final save    the last save, which the run waits for, plus the consolidated export (2 P bytes written
and export    by one rank) where checkpoint.export_dir is set.

The checkpoint rates come from benchmarks/results/h200x1-checkpoint.jsonl (CHECKPOINT_RESULTS) once
it exists; until then from the synchronous save measured on one H200 (SYNC_SAVE_*). The shared
volume's throughput is FSx for Lustre PERSISTENT_2 at FSX_MB_S_PER_TIB per TiB of the cluster's
shared_storage_gib (the sizing generators/render/runs.py gives the graceful stop).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
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
IMAGE_SOURCE = (
    "an assumption: the trainer image (CUDA 13 user space, torch 2.11 with its CUDA libraries, the EFA stack) "
    "about 12 GB, pulled from ECR at 0.2 GB/s per node; not measured"
)
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
# The keys the planner reads of each record there (first of each tuple found).
MODE_KEYS = ("async_mode", "config.checkpoint.async_mode")
BYTES_KEYS = ("state_bytes", "state_gb", "state_gib")
BLOCKING_KEYS = ("blocking_s",)
WRITE_KEYS = ("write_s", "background_write_s")
LOAD_KEYS = ("load_s",)
ASYNC_MODES = ("async", "async_with_pinned_mem")


@dataclass(frozen=True, kw_only=True)
class CheckpointRates:
    """Per-rank rates in GB/s, with where they come from."""

    write_gb_s: float  # the files' write: what a synchronous save waits for, an asynchronous one does not
    load_gb_s: float
    # The blocking copy of an asynchronous save into host memory, per async_mode; absent: not measured.
    stage_gb_s: dict[str, float] = field(default_factory=dict)
    source: str
    measured: bool  # read from CHECKPOINT_RESULTS


FALLBACK_RATES = CheckpointRates(
    write_gb_s=SYNC_SAVE_GB_S, load_gb_s=SYNC_SAVE_GB_S, source=SYNC_SAVE_SOURCE, measured=False
)


def _get(record: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value: Any = record
        for part in key.split(".", 1) if key.startswith("config.") else (key,):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            return value
    return None


def _number(value: Any, file: str, line: int, key: str) -> float:
    if type(value) not in (int, float) or not value > 0 or not math.isfinite(value):
        raise InputError(
            f"must be a positive number, got {value!r}",
            file=file,
            line=line,
            key=key,
            fix="write the measured figure of the checkpoint benchmark",
        )
    return float(value)


def read_checkpoint_rates(path: Path | None = None) -> CheckpointRates:
    """The rates of CHECKPOINT_RESULTS, or FALLBACK_RATES while that file does not exist. A record
    without its mode, state size or blocking time is bad input naming the file, line and key; the
    slowest record of each kind is counted."""
    path = path if path is not None else REPO / CHECKPOINT_RESULTS
    if not path.exists():
        return FALLBACK_RATES
    file = CHECKPOINT_RESULTS if path == REPO / CHECKPOINT_RESULTS else str(path)
    writes: list[float] = []
    loads: list[float] = []
    stages: dict[str, list[float]] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"not JSON ({err.msg})", file=file, line=number, fix="one JSON object per line") from None
        if not isinstance(record, dict):
            raise InputError("not a JSON object", file=file, line=number, fix="one JSON object per line")
        mode = _get(record, MODE_KEYS)
        if mode not in ("disabled", *ASYNC_MODES):
            raise InputError(
                f"no checkpoint mode (got {mode!r})",
                file=file,
                line=number,
                key=MODE_KEYS[0],
                fix="write async_mode: disabled, async or async_with_pinned_mem",
            )
        size_key = next((k for k in BYTES_KEYS if k in record), None)
        if size_key is None:
            raise InputError(
                "no state size", file=file, line=number, key=BYTES_KEYS[0], fix="write the bytes one rank saved"
            )
        scale = {"state_bytes": 1.0, "state_gb": GB, "state_gib": GIB}[size_key]
        gb = _number(record[size_key], file, number, size_key) * scale / GB
        blocking = _number(_get(record, BLOCKING_KEYS), file, number, BLOCKING_KEYS[0])
        write = _get(record, WRITE_KEYS)
        write_s = blocking if write is None and mode == "disabled" else _number(write, file, number, WRITE_KEYS[0])
        writes.append(gb / write_s)
        if mode in ASYNC_MODES:
            stages.setdefault(mode, []).append(gb / blocking)
        load = _get(record, LOAD_KEYS)
        if load is not None:
            loads.append(gb / _number(load, file, number, LOAD_KEYS[0]))
    if not writes:
        raise InputError("holds no record", file=file, fix="remove the empty file or record the checkpoint benchmark")
    loaded = f"{min(loads):.2f} GB/s" if loads else f"not measured, counted at the write rate {min(writes):.2f} GB/s"
    return CheckpointRates(
        write_gb_s=min(writes),
        load_gb_s=min(loads) if loads else min(writes),
        stage_gb_s={mode: min(rates) for mode, rates in stages.items()},
        source=(
            f"{file}: write {min(writes):.2f} GB/s per rank, load {loaded}"
            + "".join(f", {m} staging {min(r):.2f} GB/s" for m, r in sorted(stages.items()))
        ),
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
    start = POD_START_S + IMAGE_GB / IMAGE_PULL_GB_S
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
        write = max(state_gb / shard / rates.write_gb_s, state_gb / volume)
        interval = cfg.checkpoint.interval_steps
        saves = (steps - 1) // interval if interval and steps else 0
        mode = async_mode(cfg)
        stage = rates.stage_gb_s.get(mode) or next(iter(rates.stage_gb_s.values()), None)
        if mode in ASYNC_MODES and stage is not None:
            blocking = state_gb / shard / stage + max(0.0, write - interval * step_s)
        else:
            blocking = write
        final = write
        if cfg.checkpoint.export_dir:
            final += max(weights_gb / rates.write_gb_s, weights_gb / volume)
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
    if async_runs and not rates.stage_gb_s:
        out.append(
            "Asynchronous saves: their blocking copy into host memory is not measured yet, so they count as "
            "synchronous saves."
        )
    return out
