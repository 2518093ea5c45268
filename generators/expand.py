"""Expand an experiment matrix into one kustomize overlay per run, plus each cluster's Flux entry.

    python generators/expand.py matrix.yaml            # (re)write overlays/ and docs/generated/seed-plan.md
    python generators/expand.py matrix.yaml --check    # exit 1 naming every file that would change
    python generators/expand.py matrix.yaml --list     # table of the runs, writes nothing
    python generators/expand.py matrix.yaml --plan     # memory, speed, hours and cost of every run
    python generators/expand.py matrix.yaml --plan --base origin/main   # ... against another commit
    python generators/expand.py matrix.yaml --plan --format json        # its rows for scripts (or csv)
    python generators/expand.py matrix.yaml --out /tmp/overlays                 # the overlays only
    python generators/expand.py matrix.yaml --out /tmp/o --plan-out /tmp/docs   # and the plan document

The plan document is the --plan table of the matrix as a generated Markdown file, kept current by
--check like the overlays; it lives outside overlays/, which holds only what Flux applies. Each of
the two output directories is written all or nothing (generators/core/outdir.py), the overlays first.
An output folder belongs to one matrix (its record names it): another matrix, a folder inside another
output, or one folder for both --out and --plan-out is refused before anything is written.

Bad input (the matrix or the options) prints one line on stderr naming the file, line, key and fix,
and exits 2 without touching the output directory; other failures exit 1. The matrix format is
described in generators/matrix/ and docs/matrix.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

# `python generators/expand.py` runs the packages of the checkout it is in, never those of another checkout
# installed in the same environment (`pip install -e`): this checkout's root goes first on the import path.
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generators.core import writer
from generators.core.cli import (
    Failure,
    Output,
    errors_to_exit_codes,
    matrix_label,
    output_dir,
    owner,
    sync,
    version_option,
)
from generators.core.errors import InputError
from generators.matrix import Matrix, Run, expand, load
from generators.plan import ClusterPlan, Plan
from generators.plan.compare import plan_output
from generators.plan.estimate import plan_fitting as plan
from generators.plan.footprint import check_footprints, overflow_error
from generators.plan.table import FORMATS
from generators.plan.window import overrun_warnings
from generators.render import Layout, layout_for, render

# The checkout this command belongs to (a copy of the repository writes into itself).
REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR = writer.GENERATOR
DEFAULT_OUT = REPO_ROOT / "overlays"
# The plan document: outside overlays/ (Flux syncs that tree), with the repository's documentation.
DEFAULT_PLAN_OUT = REPO_ROOT / "docs" / "generated"
PLAN_DOCUMENT = "seed-plan.md"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("matrix", metavar="MATRIX")
@click.option(
    "--out", "out", metavar="DIR", default=None, help="Output directory (default: the repository's overlays/)."
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 naming every file that would change.")
@click.option("--list", "list_runs", is_flag=True, help="Print a table of the runs; write nothing.")
@click.option(
    "--plan",
    "show_plan",
    is_flag=True,
    help="Print what every run needs and costs (GPU and host memory, tokens/s, hours, GPU-hours, "
    "cost); write nothing; exit 1 when a run cannot fit.",
)
@click.option(
    "--plan-out",
    "plan_out",
    metavar="DIR",
    default=None,
    help=f"Directory of the plan document {PLAN_DOCUMENT} (default: the repository's docs/generated/, "
    "or none when --out is given).",
)
@click.option(
    "--base",
    metavar="REF",
    default=None,
    help="With --plan: the difference against MATRIX at git commit REF (e.g. origin/main).",
)
@click.option(
    "--prices",
    metavar="FILE",
    default=None,
    help="With --plan: the price table (default: generators/plan/prices.yaml).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="With --plan: the table (Markdown), or its rows for scripts as json or csv, on stdout.",
)
@errors_to_exit_codes
def main(
    matrix: str,
    out: str | None,
    plan_out: str | None,
    check: bool,
    list_runs: bool,
    show_plan: bool,
    base: str | None,
    prices: str | None,
    fmt: str,
) -> None:
    """Expand MATRIX (an experiment matrix, e.g. matrix.yaml) into kustomize overlays."""
    if check and list_runs:
        raise InputError("choose one", key="--check and --list", fix="drop one of the two options")
    if show_plan and (check or list_runs or out is not None or plan_out is not None):
        raise InputError(
            "choose one",
            key="--plan and --check, --list, --out or --plan-out",
            fix="--plan writes nothing: drop the other option",
        )
    if not show_plan and (base is not None or prices is not None):
        raise InputError(
            "only with --plan", key="--base" if base is not None else "--prices", fix="add --plan, or drop the option"
        )
    if fmt != "table" and (not show_plan or base is not None):
        raise InputError(
            "only with --plan, without --base" if show_plan else "only with --plan",
            key=f"--format {fmt}",
            fix="--plan --base prints the difference as a table: drop --format"
            if show_plan
            else "add --plan, or drop the option",
        )
    out_dir = output_dir(out, DEFAULT_OUT, REPO_ROOT)
    label = matrix_label(matrix, REPO_ROOT)

    m: Matrix = load(matrix)
    runs: list[Run] = expand(m)
    for warning in overrun_warnings(m, runs):
        click.echo(f"warning: {warning}", err=True)
    if show_plan:
        print_plan(matrix, label, m, runs, base, prices, fmt)
        return
    plans: list[ClusterPlan] = plan(m, runs)
    if list_runs:
        click.echo(format_table([p for cluster_plan in plans for p in cluster_plan.runs]))
        return
    # Before anything is written: every cluster's shared volume holds its runs' checkpoints.
    check_footprints(m, [p for cluster_plan in plans for p in cluster_plan.runs])
    layout: Layout = layout_for(out_dir, REPO_ROOT)
    manifests: dict[str, Any] = render(plans, layout)
    files: dict[str, bytes] = writer.serialize(manifests, label)
    more: list[Output] = []
    if plan_out is not None or out is None:
        plan_dir = output_dir(plan_out, DEFAULT_PLAN_OUT, REPO_ROOT, "--plan-out")
        document = writer.serialize_markdown({PLAN_DOCUMENT: plan_document(matrix, label, m, runs)}, label)
        more.append(Output(plan_dir, document, "--plan-out", owner("plan document", matrix, REPO_ROOT)))

    rerun = (
        f"python {GENERATOR} {matrix}"
        + (f" --out {out}" if out else "")
        + (f" --plan-out {plan_out}" if plan_out else "")
    )
    sync(
        out_dir,
        files,
        check=check,
        generator=GENERATOR,
        rerun=rerun,
        what=f"for {len(runs)} runs",
        owner=owner("overlays", matrix, REPO_ROOT),
        more=more,
    )


def plan_document(matrix_file: str, label: str, m: Matrix, runs: list[Run]) -> str:
    """The plan document: the --plan table (every run fits here: plan() refused the matrix otherwise)."""
    text, _, _ = plan_output(matrix_file, label, m, runs, None, None)
    return (
        f"# The plan of {label}\n\n"
        f"Written by `python {GENERATOR} {label}` and checked by its `--check`; what the figures are and how\n"
        "they are made: [docs/plan.md](../plan.md).\n\n" + text
    )


def print_plan(
    matrix_file: str, label: str, m: Matrix, runs: list[Run], base: str | None, prices: str | None, fmt: str
) -> None:
    """--plan: the plan (or its difference against REF, or its rows as `fmt` json or csv) on stdout;
    refused runs and a shared volume the footprint overflows make it exit 1."""
    text, refused, overflowing = plan_output(matrix_file, label, m, runs, base, prices, fmt)
    click.echo(text, nl=False)
    problems = [str(overflow_error(m, fp)) for fp in overflowing]
    if refused:
        problems.append(
            f"{refused} run{'s' if refused != 1 else ''} cannot fit: each is refused above with "
            "the cheapest change that fixes it"
        )
    if problems:
        raise Failure("\n".join(problems))


def format_table(plans: Sequence[Plan]) -> str:
    """The --list table: one row per run."""
    header = (
        "NAME",
        "CLUSTER",
        "MODEL",
        "INSTANCE TYPE",
        "NODES",
        "GPUS/NODE",
        "WORLD",
        "SHARDING",
        "ACT. CKPT",
        "EST. GIB/GPU",
    )
    rows = [header] + [
        (
            p.name,
            p.cluster,
            p.model,
            p.instance_type,
            str(p.nodes),
            str(p.gpus_per_node),
            str(p.world_size),
            p.sharding,
            p.trainer.parallelism.activation_checkpointing,
            f"{p.est_gpu_memory_gib:.1f}",
        )
        for p in plans
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = {4, 5, 6, 9}
    lines = [
        "  ".join(
            c.rjust(w) if i in numeric and r is not header else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
