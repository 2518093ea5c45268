"""The plan as text: the per-run table, the totals per cluster and the Markdown document `--plan` prints
and `expand.py` writes as docs/generated/seed-plan.md (the figures come from estimate.py); and the
per-run table for scripts (`--plan --format json|csv`): the same rows, each column of the table as one
or more fields (PLAN_FIELDS) with the figures as numbers, rounded as the table shows them."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from generators.core.markdown import table
from generators.plan.estimate import Figures, MatrixEstimate, RunEstimate, refusal_text
from generators.plan.footprint import ClusterFootprint, footprint_markdown
from generators.plan.overheads import Overheads
from trainer.memory import HEADROOM_GIB


def _hours(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.2f}" if value >= 0.1 else f"{value:.3f}"


def _cost(r: RunEstimate) -> str:
    c = r.figures.cost_usd
    text = "-" if c is None else f"{c:,.2f}"
    return f"{text} (reserved)" if r.reserved else text


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:,.1f}"


def tokens_text(f: Figures) -> str:
    """Tokens/s per GPU, with what of it is uncalibrated."""
    text = f"{f.speed.tokens_per_s_per_gpu:,.0f}"
    return text + (f" (uncalibrated: {'; '.join(f.speed.uncalibrated)})" if f.speed.uncalibrated else "")


def saves_text(o: Overheads) -> str:
    return _minutes(o.saves_s) + (f" ({o.saves} x {o.save_blocking_s:,.1f} s)" if o.saves else "")


PLAN_HEADER = (
    "run",
    "GPUs",
    "GPU memory, GiB per GPU (of)",
    "host memory loading, GiB per node (of)",
    "tokens/s per GPU",
    "start, min",
    "model load, min",
    "data staging, min",
    "saves, min",
    "final save and export, min",
    "hours",
    "GPU-hours",
    "cost, USD",
)


def plan_rows(runs: Sequence[RunEstimate]) -> list[list[str]]:
    rows = []
    for r in runs:
        f = r.figures
        o = f.overheads
        rows.append(
            [
                r.name + (" REFUSED" if r.refusal else ""),
                str(f.world),
                f"{f.gpu_gib:.1f} ({f.gpu_capacity_gib}, {f.gpu_gib / f.gpu_capacity_gib:.0%})",
                f"{f.host_gib:,.0f} ({f.host_capacity_gib:,})",
                tokens_text(f),
                _minutes(o.start_s),
                _minutes(o.model_load_s),
                _minutes(o.staging_s),
                saves_text(o),
                _minutes(o.final_s),
                _hours(f.hours),
                _hours(f.gpu_hours),
                _cost(r),
            ]
        )
    return rows


# The table's columns (PLAN_HEADER, in order) -> the fields of `--format json|csv` that carry them;
# besides them, each row names its cluster, and a refused run its reason and fix.
PLAN_FIELDS: dict[str, tuple[str, ...]] = {
    "run": ("run", "cluster", "refused", "reason", "fix"),
    "GPUs": ("gpus",),
    "GPU memory, GiB per GPU (of)": ("gpu_memory_gib_per_gpu", "gpu_memory_of_gib"),
    "host memory loading, GiB per node (of)": ("host_memory_loading_gib_per_node", "host_memory_of_gib"),
    "tokens/s per GPU": ("tokens_per_s_per_gpu", "uncalibrated"),
    "start, min": ("start_min",),
    "model load, min": ("model_load_min",),
    "data staging, min": ("data_staging_min",),
    "saves, min": ("saves_min", "saves", "save_blocking_s"),
    "final save and export, min": ("final_save_and_export_min",),
    "hours": ("hours",),
    "GPU-hours": ("gpu_hours",),
    "cost, USD": ("cost_usd", "reserved"),
}
FORMATS = ("table", "json", "csv")


def _number(value: float, digits: int) -> float | int | None:
    """As the table rounds it (0 digits: an integer); None where the table shows '-' (hours of a
    dataset of unknown size)."""
    if math.isnan(value):
        return None
    return round(value, digits) if digits else round(value)


def plan_records(runs: Sequence[RunEstimate]) -> list[dict[str, Any]]:
    """plan_rows as records: one per run, the fields of PLAN_FIELDS in order."""
    out = []
    for r in runs:
        f = r.figures
        o = f.overheads
        record: dict[str, Any] = {
            "run": r.name,
            "cluster": r.cluster,
            "refused": r.refusal is not None,
            "reason": r.refusal.reason if r.refusal else "",
            "fix": r.refusal.fix if r.refusal else "",
            "gpus": f.world,
            "gpu_memory_gib_per_gpu": _number(f.gpu_gib, 1),
            "gpu_memory_of_gib": f.gpu_capacity_gib,
            "host_memory_loading_gib_per_node": _number(f.host_gib, 0),
            "host_memory_of_gib": f.host_capacity_gib,
            "tokens_per_s_per_gpu": _number(f.speed.tokens_per_s_per_gpu, 0),
            "uncalibrated": "; ".join(f.speed.uncalibrated),
            "start_min": _number(o.start_s / 60, 1),
            "model_load_min": _number(o.model_load_s / 60, 1),
            "data_staging_min": _number(o.staging_s / 60, 1),
            "saves_min": _number(o.saves_s / 60, 1),
            "saves": o.saves,
            "save_blocking_s": _number(o.save_blocking_s, 1),
            "final_save_and_export_min": _number(o.final_s / 60, 1),
            "hours": _number(f.hours, 3),
            "gpu_hours": _number(f.gpu_hours, 3),
            "cost_usd": None if f.cost_usd is None else _number(f.cost_usd, 2),
            "reserved": r.reserved,
        }
        out.append({k: record[k] for fields in PLAN_FIELDS.values() for k in fields})
    return out


def plan_formatted(est: MatrixEstimate, fmt: str) -> str:
    """The per-run table as `fmt`: "json" (a list of records), else CSV (a header, then a row per run;
    true/false, and nothing for a missing number)."""
    records = plan_records(est.runs)
    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    text = io.StringIO()
    writer = csv.DictWriter(
        text, fieldnames=[k for fields in PLAN_FIELDS.values() for k in fields], lineterminator="\n"
    )
    writer.writeheader()
    for record in records:
        writer.writerow(
            {k: "" if v is None else str(v).lower() if isinstance(v, bool) else v for k, v in record.items()}
        )
    return text.getvalue()


def totals(runs: Sequence[RunEstimate]) -> list[tuple[str, int, float, float, bool]]:
    """(cluster, runs, GPU-hours, cost USD, reserved) per cluster in first-seen order; refused runs
    count nowhere (they do not run)."""
    out: dict[str, list] = {}
    for r in runs:
        row = out.setdefault(r.cluster, [r.cluster, 0, 0.0, 0.0, r.reserved])
        if r.refusal is None:
            row[1] += 1
            row[2] += 0.0 if math.isnan(r.figures.gpu_hours) else r.figures.gpu_hours
            row[3] += r.figures.cost_usd or 0.0
    return [tuple(v) for v in out.values()]


def plan_markdown(est: MatrixEstimate, footprints: Sequence[ClusterFootprint] = ()) -> str:
    """The plan; `footprints` (footprint.cluster_footprints of the runs that are not refused) adds each
    cluster's shared volume under the totals."""
    lines = [
        f"### Plan: {est.matrix_file}, {len(est.runs)} runs",
        "",
        "Predicted before anything runs: GPU memory by trainer/memory.py (a run fits with "
        f"{HEADROOM_GIB:.1f} GiB of the GPU left for the allocator's cache and what lies outside it), speed by "
        "generators/plan/speed.py, what a run spends besides its steps by generators/plan/overheads.py, cost at "
        "On-Demand prices (generators/plan/prices.yaml). Hours count the training steps, the start, the model "
        "load, the data staging, the blocking part of every save and the final save and export.",
        "",
        table(PLAN_HEADER, plan_rows(est.runs)),
        "",
        table(
            ("cluster", "runs", "GPU-hours", "cost, USD"),
            [
                [c, str(n), f"{g:,.1f}", f"{u:,.2f}" + (" (reserved)" if res else "")]
                for c, n, g, u, res in totals(est.runs)
            ],
        ),
    ]
    if footprints:
        lines += ["", footprint_markdown(footprints)]
    if est.refused:
        lines += ["", "Refused (they cannot fit):"]
        for r in est.refused:
            assert r.refusal is not None
            lines.append(f"- {r.name}: {refusal_text(r.refusal)}")
    lines += ["", "Assumptions:"] + [f"- {n}" for n in est.notes]
    return "\n".join(lines) + "\n"
