"""The plan as text: the per-run table, the totals per cluster and the Markdown document `--plan` prints
and `expand.py` writes as docs/generated/seed-plan.md (the figures come from estimate.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from generators.core.markdown import table
from generators.plan.estimate import Figures, MatrixEstimate, RunEstimate, refusal_text
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


def plan_markdown(est: MatrixEstimate) -> str:
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
    if est.refused:
        lines += ["", "Refused (they cannot fit):"]
        for r in est.refused:
            assert r.refusal is not None
            lines.append(f"- {r.name}: {refusal_text(r.refusal)}")
    lines += ["", "Assumptions:"] + [f"- {n}" for n in est.notes]
    return "\n".join(lines) + "\n"
