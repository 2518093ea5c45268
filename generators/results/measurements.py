"""Benchmark and trainer results -> measurements -> scaling points (the report's core; no output).

What an input is, how warm-up is dropped and how repeats combine is described in generators/report.py.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generators.core.errors import InputError
from generators.core.yamlio import read_input
from generators.plan.speed import predict_measured

DEFAULT_WARMUP_LOGS = 3
# A results file larger than this is refused (a long run logs well under 100 MB of JSON lines).
MAX_RESULTS_BYTES = 256 * 1024 * 1024
BENCH_FIX = "pass JSON lines written by benchmarks/common.py emit() (e.g. benchmarks/train_bench.py --json FILE)"
RUN_FIX = "pass a trainer run directory (metrics.output_dir of trainer/train.py: metrics.jsonl and run.json)"
INPUT_FIX = "pass benchmark JSON-lines files and/or trainer run directories"
# A series is one configuration across world sizes: these fields, as a benchmark record's flat
# config (benchmarks/common.py; the FSDP1 baseline's own keys second) or a trainer run's nested one
# (run.json) names them.
CONFIGURATION = (
    ("model", ("model", "model.name")),
    ("seq", ("seq_len", "data.seq_len")),
    ("batch", ("batch_size_per_gpu", "training.batch_size_per_gpu")),
    ("precision", ("parallelism.precision", "precision")),
    ("strategy", ("parallelism.sharding_strategy", "sharding")),
    ("checkpointing", ("parallelism.activation_checkpointing", "activation_checkpointing")),
)


@dataclass(frozen=True)
class Measurement:
    """One measured configuration: a benchmark line, or a trainer run's medians after warm-up."""

    series: str
    world_size: int
    tokens_per_s_per_gpu: float
    mfu: float  # a fraction of the GPU's peak
    step_time_s: float
    peak_mem_gib: float | None  # None where the source has none (a benchmark on CPU)
    source: str  # `file:line` of a benchmark record, or the trainer run as given
    device: str  # GPU name, "cpu", or "" when the source does not say
    command: str  # the command that measured it (benchmarks), or ""
    note: str = ""  # how the figures were taken, where the command does not say
    # (field, value) of CONFIGURATION that the source records: what tells apart two configurations
    # measured under one name.
    configuration: tuple[tuple[str, Any], ...] = ()
    # The speed model's figure for this configuration (generators/plan/speed.py); None where it does
    # not apply (a CPU, the FSDP1 baseline).
    predicted_tokens_per_s_per_gpu: float | None = None
    # GPUs (processes) per node where the source records it (a trainer run's run.json), else None.
    local_world_size: int | None = None


@dataclass(frozen=True)
class Point:
    """One series at one world size, with its scaling efficiency."""

    series: str
    world_size: int
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    mfu: float
    step_time_s: float
    peak_mem_gib: float | None
    efficiency: float  # tokens/s per GPU over that of the series at baseline_world_size
    baseline_world_size: int
    measurements: tuple[Measurement, ...]
    predicted_tokens_per_s_per_gpu: float | None = None


# ---------------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class _At:
    """Where a record came from, for error messages."""

    file: str
    line: int
    fix: str
    text: str = ""  # a whole-JSON file's text: keys are then located by searching it


def _fail(at: _At, key: str, message: str) -> InputError:
    line = at.line or (_json_key_line(at.text, key) if at.text else 0)
    return InputError(message, file=at.file, line=line, key=key, fix=at.fix)


def _json_key_line(text: str, key: str) -> int:
    """Line of a dotted key in indented JSON (run.json), or of its nearest present parent; 0 if none."""
    pos, line = 0, 0
    for part in key.split("."):
        found = text.find(json.dumps(part) + ":", pos)
        if found < 0:
            break
        pos = found
        line = text.count("\n", 0, found) + 1
    return line


def _read_text(path: Path, label: str, fix: str) -> str:
    try:
        return read_input(str(path), label=label, fix=fix, max_bytes=MAX_RESULTS_BYTES)
    except InputError as err:
        if err.message == "file not found":
            raise InputError("no such file", file=label, fix=fix) from None
        raise


def _json_lines(path: Path, label: str, fix: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line; at least one."""
    records = []
    for number, line in enumerate(_read_text(path, label, fix).split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"not JSON ({err.msg} at column {err.colno})", file=label, line=number, fix=fix) from None
        except RecursionError:
            raise InputError("nested too deeply to be a record", file=label, line=number, fix=fix) from None
        if not isinstance(value, dict):
            raise InputError(f"a JSON {type(value).__name__}, not an object", file=label, line=number, fix=fix)
        records.append((number, value))
    if not records:
        raise InputError("holds no records (empty input)", file=label, fix=fix)
    return records


def _get(record: dict[str, Any], key: str, at: _At) -> Any:
    node: Any = record
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise _fail(at, key, "missing")
        node = node[part]
    return node


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(record: dict[str, Any], key: str, at: _At, minimum: int = 1) -> int:
    value = _get(record, key, at)
    if type(value) is not int or value < minimum:
        raise _fail(at, key, f"must be an integer >= {minimum}, got {_shown(value)}")
    return value


def _number(record: dict[str, Any], key: str, at: _At, *, positive: bool) -> float:
    value = _get(record, key, at)
    ok = type(value) in (int, float) and math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise _fail(at, key, f"must be a finite number {'> 0' if positive else '>= 0'}, got {_shown(value)}")
    return float(value)


def _text(record: dict[str, Any], key: str, at: _At) -> str:
    value = _get(record, key, at)
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise _fail(at, key, f"must be a non-empty line of text, got {_shown(value)}")
    return value


def _scalar_at(config: dict[str, Any], key: str) -> Any:
    """config[key] for a flat key, else the nested value at the dotted path; None unless a scalar."""
    node: Any = config.get(key) if key in config else config
    if key not in config:
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, (str, int, float, bool)) else None


def configuration_of(config: Any) -> tuple[tuple[str, Any], ...]:
    """The CONFIGURATION fields a recorded config has, in CONFIGURATION's order."""
    if not isinstance(config, dict):
        return ()
    out = []
    for name, keys in CONFIGURATION:
        value = next((v for v in (_scalar_at(config, k) for k in keys) if v is not None), None)
        if value is not None:
            out.append((name, value))
    return tuple(out)


def load_benchmarks(path: Path, label: str) -> list[Measurement]:
    """Every record of a benchmarks/common.py emit() JSON-lines file."""
    out = []
    for line, record in _json_lines(path, label, BENCH_FIX):
        at = _At(label, line, BENCH_FIX)
        versions = record.get("versions")
        device = versions.get("gpu", "") if isinstance(versions, dict) else ""
        device = device if isinstance(device, str) else ""
        world_size = _int(record, "world_size", at)
        config = record.get("config")
        # Launch agents (benchmarks/suite.py --nodes) split one host's GPUs between them.
        nodes = record.get("nodes")
        agents = nodes if type(nodes) is int and nodes > 0 else 1
        predicted = (
            predict_measured(config, world_size, world_size // agents, device, one_host=True)
            if isinstance(config, dict)
            else None
        )
        out.append(
            Measurement(
                series=_text(record, "name", at),
                world_size=world_size,
                tokens_per_s_per_gpu=_number(record, "tokens_per_s_per_gpu", at, positive=True),
                mfu=_number(record, "mfu", at, positive=False),
                step_time_s=_number(record, "median_step_time_s", at, positive=True),
                peak_mem_gib=(
                    _number(record, "peak_allocated_gib", at, positive=False)
                    if "peak_allocated_gib" in record
                    else None
                ),
                source=f"{label}:{line}",
                device=device,
                command=_text(record, "command", at),
                configuration=configuration_of(config),
                predicted_tokens_per_s_per_gpu=predicted,
            )
        )
    return out


def load_run(path: Path, label: str, warmup_logs: int) -> Measurement:
    """A trainer run (its metrics.output_dir, or the metrics.jsonl in it): medians after warm-up."""
    metrics_path = path / "metrics.jsonl" if path.is_dir() else path
    metrics_label = os.path.join(label, "metrics.jsonl") if path.is_dir() else label
    info_label = os.path.join(os.path.dirname(metrics_label), "run.json")
    if not metrics_path.is_file():
        raise InputError(
            "no metrics.jsonl in this directory",
            file=label,
            fix=RUN_FIX + ", or the benchmark JSON-lines files themselves",
        )

    info_text = _read_text(metrics_path.parent / "run.json", info_label, RUN_FIX)
    try:
        info = json.loads(info_text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"not JSON ({err.msg} at column {err.colno})", file=info_label, line=err.lineno, fix=RUN_FIX
        ) from None
    except RecursionError:
        raise InputError("nested too deeply to be run information", file=info_label, fix=RUN_FIX) from None
    if not isinstance(info, dict):
        raise InputError("is not a JSON object", file=info_label, fix=RUN_FIX)
    at_info = _At(info_label, 0, RUN_FIX, info_text)
    world_size = _int(info, "world_size", at_info)
    strategy = _text(info, "config.parallelism.sharding_strategy", at_info)
    series = f"{_text(info, 'config.model.name', at_info)} {strategy}"
    if strategy == "HYBRID_SHARD":
        series += f" (shard groups of {_int(info, 'mesh.shard', at_info)})"
    device = info.get("device_name")
    local = info.get("local_world_size")
    predicted = (
        predict_measured(info["config"], world_size, local, device)
        if type(local) is int and isinstance(device, str) and isinstance(info.get("config"), dict)
        else None
    )

    kept: list[tuple[float, float, float, float]] = []
    previous: tuple[int, int] | None = None
    launches = since_launch = 0
    records = _json_lines(metrics_path, metrics_label, RUN_FIX)
    for line, record in records:
        at = _At(metrics_label, line, RUN_FIX)
        step = _int(record, "step", at)
        restart = _int(record, "restart_count", at, minimum=0)
        logged_world = _int(record, "world_size", at)
        if logged_world != world_size:
            raise _fail(
                at,
                "world_size",
                f"is {logged_world} but {info_label} says {world_size} (a launch at "
                "another size shares this directory)",
            )
        figures = (
            _number(record, "tokens_per_s_per_gpu", at, positive=True),
            _number(record, "mfu", at, positive=False),
            _number(record, "step_time_s", at, positive=True),
            _number(record, "peak_mem_gib", at, positive=False),
        )
        if previous is None or restart != previous[1] or step <= previous[0]:
            launches += 1
            since_launch = 0
        previous = (step, restart)
        since_launch += 1
        if since_launch > warmup_logs:
            kept.append(figures)
    if not kept:
        raise InputError(
            f"all {len(records)} logged steps ({launches} launch(es)) are warm-up with --warmup-logs {warmup_logs}",
            file=metrics_label,
            key="step",
            fix="train more steps or log more often, or lower --warmup-logs",
        )
    columns = list(zip(*kept, strict=True))
    return Measurement(
        series=series,
        world_size=world_size,
        tokens_per_s_per_gpu=statistics.median(columns[0]),
        mfu=statistics.median(columns[1]),
        step_time_s=statistics.median(columns[2]),
        peak_mem_gib=statistics.median(columns[3]),
        source=label,
        device=device if isinstance(device, str) else "",
        command="",
        note=f"median of {len(kept)} logged steps after {warmup_logs} warm-up logs per launch ({launches} launch(es))",
        configuration=configuration_of(info["config"]),
        predicted_tokens_per_s_per_gpu=predicted,
        local_world_size=local if type(local) is int and local > 0 else None,
    )


def load(inputs: Sequence[str], warmup_logs: int) -> list[Measurement]:
    """Every measurement of INPUT..., in input order."""
    if not inputs:
        raise InputError("no INPUT given (empty input)", key="INPUT", fix=INPUT_FIX)
    out: list[Measurement] = []
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise InputError("no such file or directory", file=raw, fix=INPUT_FIX)
        if path.is_dir() or path.name == "metrics.jsonl":
            out.append(load_run(path, raw, warmup_logs))
        else:
            out.extend(load_benchmarks(path, raw))
    return out


# ---------------------------------------------------------------------------------------------------
# Scaling


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def series_labels(measurements: Sequence[Measurement]) -> list[str]:
    """Each measurement's series: its name, and where one name covers several configurations (a
    suite run over models, say), the CONFIGURATION fields that tell them apart, so each scales alone."""
    seen: dict[str, set[tuple[tuple[str, Any], ...]]] = {}
    for m in measurements:
        seen.setdefault(m.series, set()).add(m.configuration)
    labels = []
    for m in measurements:
        configs = seen[m.series]
        differing = [name for name, _ in CONFIGURATION if len({dict(c).get(name) for c in configs}) > 1]
        mine = dict(m.configuration)
        fields = ", ".join(f"{name} {mine.get(name, '-')}" for name in differing)
        labels.append(f"{m.series} ({fields})" if differing else m.series)
    # Where one series has a world size measured on two topologies (2 GPUs: 1 node x 2, or 2 nodes x 1),
    # the GPUs per node split it: NVLink within a node and the network between nodes are different
    # curves, and a median of the two would be neither.
    topologies: dict[tuple[str, int], set[int | None]] = {}
    for m, label in zip(measurements, labels, strict=True):
        topologies.setdefault((label, m.world_size), set()).add(m.local_world_size)
    split = {label for (label, _), locals_ in topologies.items() if len(locals_) > 1}
    return [
        f"{label}, {per_node(m.local_world_size)}" if label in split else label
        for m, label in zip(measurements, labels, strict=True)
    ]


def per_node(local_world_size: int | None) -> str:
    if local_world_size is None:
        return "GPUs per node not recorded"
    return f"{local_world_size} GPU{'s' if local_world_size != 1 else ''} per node"


def summarise(measurements: Sequence[Measurement], baseline_world_size: int | None = None) -> list[Point]:
    """Group into series (series_labels), combine repeats by the median, and compute totals and efficiency."""
    groups: dict[tuple[str, int], list[Measurement]] = {}
    for m, label in zip(measurements, series_labels(measurements), strict=True):
        groups.setdefault((label, m.world_size), []).append(m)
    points: list[Point] = []
    for name in sorted({series for series, _ in groups}):
        sizes = sorted(size for series, size in groups if series == name)
        baseline = sizes[0] if baseline_world_size is None else baseline_world_size
        if baseline not in sizes:
            raise InputError(
                f"series {name!r} has no measurement at {baseline} GPUs (it has {', '.join(map(str, sizes))})",
                key="--baseline-world-size",
                fix="leave the option out (each series' smallest world size) or add a run at that size",
            )
        per_gpu = {size: statistics.median(m.tokens_per_s_per_gpu for m in groups[(name, size)]) for size in sizes}
        for size in sizes:
            group = groups[(name, size)]
            points.append(
                Point(
                    series=name,
                    world_size=size,
                    tokens_per_s_per_gpu=per_gpu[size],
                    tokens_per_s=per_gpu[size] * size,
                    mfu=statistics.median(m.mfu for m in group),
                    step_time_s=statistics.median(m.step_time_s for m in group),
                    peak_mem_gib=_median_or_none([m.peak_mem_gib for m in group]),
                    efficiency=per_gpu[size] / per_gpu[baseline],
                    baseline_world_size=baseline,
                    measurements=tuple(group),
                    predicted_tokens_per_s_per_gpu=_median_or_none([m.predicted_tokens_per_s_per_gpu for m in group]),
                )
            )
    return points
