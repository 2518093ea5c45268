"""Expand an experiment matrix into one kustomize overlay per run, plus each cluster's Flux entry.

    python generators/expand.py matrix.yaml            # (re)write overlays/
    python generators/expand.py matrix.yaml --check    # exit 1 naming every file that would change
    python generators/expand.py matrix.yaml --list     # table of the runs, writes nothing
    python generators/expand.py matrix.yaml --plan     # memory, speed, hours and cost of every run
    python generators/expand.py matrix.yaml --plan --base origin/main   # ... against another commit
    python generators/expand.py matrix.yaml --out /tmp/overlays

Bad input (the matrix or the options) prints one line on stderr naming the file, line, key and fix,
and exits 2 without touching the output directory; other failures exit 1. The matrix format is
described in generators/matrix/ and README.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from generators.core import writer
from generators.core.cli import Failure, errors_to_exit_codes, matrix_label, output_dir, sync
from generators.core.errors import InputError
from generators.matrix import Matrix, Run, expand, load
from generators.plan import ClusterPlan, Plan, plan
from generators.plan.compare import plan_output
from generators.render import Layout, layout_for, render

# The checkout this command belongs to (a copy of the repository writes into itself).
REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR = writer.GENERATOR
DEFAULT_OUT = REPO_ROOT / "overlays"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
@errors_to_exit_codes
def main(
    matrix: str, out: str | None, check: bool, list_runs: bool, show_plan: bool, base: str | None, prices: str | None
) -> None:
    """Expand MATRIX (an experiment matrix, e.g. matrix.yaml) into kustomize overlays."""
    if check and list_runs:
        raise InputError("choose one", key="--check and --list", fix="drop one of the two options")
    if show_plan and (check or list_runs or out is not None):
        raise InputError(
            "choose one", key="--plan and --check, --list or --out", fix="--plan writes nothing: drop the other option"
        )
    if not show_plan and (base is not None or prices is not None):
        raise InputError(
            "only with --plan", key="--base" if base is not None else "--prices", fix="add --plan, or drop the option"
        )
    out_dir = output_dir(out, DEFAULT_OUT, REPO_ROOT)
    label = matrix_label(matrix, REPO_ROOT)

    m: Matrix = load(matrix)
    runs: list[Run] = expand(m)
    if show_plan:
        print_plan(matrix, label, m, runs, base, prices)
        return
    plans: list[ClusterPlan] = plan(m, runs)
    if list_runs:
        click.echo(format_table([p for cluster_plan in plans for p in cluster_plan.runs]))
        return
    layout: Layout = layout_for(out_dir, REPO_ROOT)
    manifests: dict[str, Any] = render(plans, layout)
    files: dict[str, bytes] = writer.serialize(manifests, label)

    rerun = f"python {GENERATOR} {matrix}" + (f" --out {out}" if out else "")
    sync(out_dir, files, check=check, generator=GENERATOR, rerun=rerun, what=f"for {len(runs)} runs")


def print_plan(matrix_file: str, label: str, m: Matrix, runs: list[Run], base: str | None, prices: str | None) -> None:
    """--plan: the plan (or its difference against REF) on stdout; refused runs make it exit 1."""
    text, refused = plan_output(matrix_file, label, m, runs, base, prices)
    click.echo(text, nl=False)
    if refused:
        raise Failure(
            f"{refused} run{'s' if refused != 1 else ''} cannot fit: each is refused above with "
            "the cheapest change that fixes it"
        )


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
            c.rjust(w) if i in numeric and r is not header else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
