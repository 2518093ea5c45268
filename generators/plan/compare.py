"""`expand.py --plan --base REF`: the plan of this change against the plan of another commit's matrix.

The matrix file is read at REF with git (`git show REF:<the same path>`) and planned by this code
with this price table and speed model, so the difference shows what the matrix change does, not
what a model change does. Runs are matched by cluster and the readable part of their name (model,
instance family, nodes, strategy, rev: everything but the configuration hash): a run in both with
another hash is changed, and the keys that differ are listed with its tokens/s per GPU, hours and
cost before and after; the rest are added or removed. A change that makes a run impossible to fit is
an error row with the refusal, and its cost before is left out of the difference (a run that cannot
run saves nothing). A matrix that does not exist at REF counts as no runs (a pull request that adds
it). An unknown REF or a path outside a git repository is bad input (--base).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generators.core.errors import InputError, ToolError
from generators.core.markdown import table
from generators.matrix import Matrix, Run, expand, load
from generators.plan import plan_runs
from generators.plan.cost import load_prices
from generators.plan.estimate import (
    MatrixEstimate,
    RunEstimate,
    estimate_matrix,
    refusal_text,
)
from generators.plan.footprint import ClusterFootprint, cluster_footprints
from generators.plan.table import PLAN_HEADER, plan_formatted, plan_markdown, plan_rows

BASE_FIX = "pass a commit, branch or tag of this repository (e.g. origin/main; in CI fetch it first)"


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ToolError("git not found on PATH; --base reads the matrix at REF with git") from None


def matrix_at(ref: str, matrix_path: str) -> tuple[str, str | None]:
    """(`REF:path` naming the file there, its text or None when it does not exist at REF)."""
    if not ref or ref.startswith("-"):
        raise InputError(f"{ref!r} is not a commit name", key="--base", fix=BASE_FIX)
    path = Path(matrix_path).resolve()
    top = _git(path.parent, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise InputError(f"{matrix_path} is not inside a git repository", key="--base", fix=BASE_FIX)
    root = Path(top.stdout.strip())
    if _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise InputError(f"{ref!r} is not a commit of {root.name}", key="--base", fix=BASE_FIX)
    rel = path.relative_to(root.resolve()).as_posix()
    shown = _git(root, "show", f"{ref}:{rel}")
    return f"{ref}:{rel}", shown.stdout if shown.returncode == 0 else None


def identity(r: RunEstimate) -> tuple[str, str]:
    return r.cluster, r.name.rsplit("-", 1)[0]


@dataclass(frozen=True, kw_only=True)
class Change:
    old: RunEstimate
    new: RunEstimate
    differences: tuple[str, ...]  # "key: old -> new"


@dataclass(frozen=True, kw_only=True)
class PlanDiff:
    base: str  # the REF as given
    old: MatrixEstimate | None
    new: MatrixEstimate
    added: tuple[RunEstimate, ...]
    removed: tuple[RunEstimate, ...]
    changed: tuple[Change, ...]

    @property
    def errors(self) -> tuple[Change, ...]:
        """Changed runs that fitted before and are refused now."""
        return tuple(c for c in self.changed if c.new.refusal is not None and c.old.refusal is None)


def _differences(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, ...]:
    keys = sorted(set(a) | set(b))
    return tuple(f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in keys if a.get(k) != b.get(k))


def diff(base: str, old: MatrixEstimate | None, new: MatrixEstimate) -> PlanDiff:
    before = {identity(r): r for r in (old.runs if old else ())}
    after = {identity(r): r for r in new.runs}
    changed = tuple(
        Change(old=before[k], new=r, differences=_differences(before[k].settings, r.settings))
        for k, r in after.items()
        if k in before and before[k].name != r.name
    )
    return PlanDiff(
        base=base,
        old=old,
        new=new,
        added=tuple(r for k, r in after.items() if k not in before),
        removed=tuple(r for k, r in before.items() if k not in after),
        changed=changed,
    )


def _sum(runs: tuple[RunEstimate, ...]) -> tuple[int, float, float]:
    kept = [r for r in runs if r.refusal is None]
    gpu_hours = sum(0.0 if math.isnan(r.figures.gpu_hours) else r.figures.gpu_hours for r in kept)
    return len(kept), gpu_hours, sum(r.figures.cost_usd or 0.0 for r in kept)


def _arrow(before: str, after: str) -> str:
    return before if before == after else f"{before} -> {after}"


def _money(r: RunEstimate) -> str:
    if r.refusal is not None:
        return "REFUSED"
    return "-" if r.figures.cost_usd is None else f"{r.figures.cost_usd:,.2f}"


def _fig(r: RunEstimate, value: float, fmt: str) -> str:
    return "REFUSED" if r.refusal is not None else ("-" if math.isnan(value) else format(value, fmt))


CHANGED_HEADER = ("run", "tokens/s per GPU", "hours", "cost, USD", "error")


def changed_rows(changes: tuple[Change, ...]) -> list[list[str]]:
    """Before -> after of each changed run; a run the change makes unfit is an error row."""
    out = []
    for c in changes:
        o, n = c.old, c.new
        error = f"ERROR: {refusal_text(n.refusal)}" if n.refusal is not None else ""
        out.append(
            [
                f"{o.name} -> {n.name}",
                _arrow(
                    _fig(o, o.figures.speed.tokens_per_s_per_gpu, ",.0f"),
                    _fig(n, n.figures.speed.tokens_per_s_per_gpu, ",.0f"),
                ),
                _arrow(_fig(o, o.figures.hours, ",.2f"), _fig(n, n.figures.hours, ",.2f")),
                _arrow(_money(o), _money(n)),
                error,
            ]
        )
    return out


def diff_markdown(d: PlanDiff, footprints: Sequence[ClusterFootprint] = ()) -> str:
    # A run the change makes unfit is no saving: it counts on neither side of the difference.
    unfit = {identity(c.new) for c in d.errors}
    n0, g0, c0 = _sum(tuple(r for r in d.old.runs if identity(r) not in unfit)) if d.old else (0, 0.0, 0.0)
    n1, g1, c1 = _sum(d.new.runs)
    lines = [
        f"### Plan difference against {d.base}",
        "",
        table(
            ("", "runs", "GPU-hours", "cost, USD"),
            [
                [f"{d.base}" + ("" if d.old else " (no matrix there)"), str(n0), f"{g0:,.1f}", f"{c0:,.2f}"],
                ["this change", str(n1), f"{g1:,.1f}", f"{c1:,.2f}"],
                ["difference", f"{n1 - n0:+d}", f"{g1 - g0:+,.1f}", f"{c1 - c0:+,.2f}"],
            ],
        ),
        "",
    ]
    lines.append(
        f"Added: {len(d.added)}, removed: {len(d.removed)}, changed: {len(d.changed)} (refused runs count in no total)."
    )
    if d.errors:
        lost = sum(c.old.figures.cost_usd or 0.0 for c in d.errors)
        lines += [
            "",
            f"ERROR: this change makes {len(d.errors)} run(s) impossible to fit; they are not savings: their "
            f"{f'${lost:,.2f}' if lost else 'cost'} before is left out of the difference. Fix them or remove them.",
        ]
    if d.added:
        lines += ["", "Added:", "", table(PLAN_HEADER, plan_rows(d.added))]
    if d.removed:
        lines += ["", "Removed:", "", table(PLAN_HEADER, plan_rows(d.removed))]
    if d.changed:
        lines += ["", "Changed:", "", table(CHANGED_HEADER, changed_rows(d.changed)), ""]
        for c in d.changed:
            lines.append(f"- {c.old.name} -> {c.new.name}: " + "; ".join(c.differences))
    lines += [
        "",
        "<details><summary>The whole plan of this change</summary>",
        "",
        plan_markdown(d.new, footprints).rstrip(),
        "",
        "</details>",
    ]
    return "\n".join(lines) + "\n"


def plan_output(
    matrix_file: str,
    label: str,
    matrix: Matrix,
    runs: list[Run],
    base: str | None,
    prices_file: str | None,
    fmt: str = "table",
) -> tuple[str, int, tuple[ClusterFootprint, ...]]:
    """(the Markdown `expand.py --plan [--base REF]` prints, or its per-run table as `fmt` json or csv;
    how many runs are refused; the clusters whose shared volume the footprint overflows); `label` names
    the matrix in the title (the banners' name for it: the same text from any directory)."""
    prices = load_prices(prices_file, prices_file)
    plans = plan_runs(matrix, runs, reject_unfit=False)
    new = dataclasses.replace(estimate_matrix(matrix, plans, prices), matrix_file=label)
    # The shared volumes hold the runs that run: a refused one writes nothing.
    refused = {r.name for r in new.refused}
    footprints = cluster_footprints(matrix, [p for p in plans if p.name not in refused])
    overflowing = tuple(fp for fp in footprints if not fp.fits)
    if fmt != "table":
        return plan_formatted(new, fmt), len(new.refused), overflowing
    if base is None:
        return plan_markdown(new, footprints), len(new.refused), overflowing
    label, text = matrix_at(base, matrix_file)
    old = None
    if text is not None:
        # The matrix as it was: its Capacity Block may have ended since, which concerns only the new one.
        before = load(label, text, now=dt.datetime.min.replace(tzinfo=dt.UTC))
        old = estimate_matrix(before, plan_runs(before, expand(before), reject_unfit=False), prices)
    return diff_markdown(diff(base, old, new), footprints), len(new.refused), overflowing
