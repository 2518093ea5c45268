"""Expand an experiment matrix into one kustomize overlay per run, plus each cluster's Flux entry.

    python generators/expand.py matrix.yaml            # (re)write overlays/
    python generators/expand.py matrix.yaml --check    # exit 1 naming every file that would change
    python generators/expand.py matrix.yaml --list     # table of the runs, writes nothing
    python generators/expand.py matrix.yaml --out /tmp/overlays

Bad input (the matrix or the options) prints one line on stderr naming the file, line, key and fix,
and exits 2 without touching the output directory; other failures exit 1. The matrix format is
described in generators/matrix/ and README.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import click

from generators.core import writer
from generators.core.cli import errors_to_exit_codes, matrix_label, output_dir, sync
from generators.core.errors import InputError
from generators.matrix import Matrix, Run, expand, load
from generators.plan import ClusterPlan, Plan, plan
from generators.render import Layout, layout_for, render

# The checkout this command belongs to (a copy of the repository writes into itself).
REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR = writer.GENERATOR
DEFAULT_OUT = REPO_ROOT / "overlays"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("matrix", metavar="MATRIX")
@click.option("--out", "out", metavar="DIR", default=None,
              help="Output directory (default: the repository's overlays/).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 naming every file that would change.")
@click.option("--list", "list_runs", is_flag=True, help="Print a table of the runs; write nothing.")
@errors_to_exit_codes
def main(matrix: str, out: str | None, check: bool, list_runs: bool) -> None:
    """Expand MATRIX (an experiment matrix, e.g. matrix.yaml) into kustomize overlays."""
    if check and list_runs:
        raise InputError("choose one", key="--check and --list", fix="drop one of the two options")
    out_dir = output_dir(out, DEFAULT_OUT)
    label = matrix_label(matrix, REPO_ROOT)

    m: Matrix = load(matrix)
    runs: list[Run] = expand(m)
    plans: list[ClusterPlan] = plan(m, runs)
    if list_runs:
        click.echo(format_table([p for cluster_plan in plans for p in cluster_plan.runs]))
        return
    layout: Layout = layout_for(out_dir, REPO_ROOT)
    manifests: dict[str, Any] = render(plans, layout)
    files: dict[str, bytes] = writer.serialize(manifests, label)

    rerun = f"python {GENERATOR} {matrix}" + (f" --out {out}" if out else "")
    sync(out_dir, files, check=check, generator=GENERATOR, rerun=rerun, what=f"for {len(runs)} runs")


def format_table(plans: Sequence[Plan]) -> str:
    """The --list table: one row per run."""
    header = ("NAME", "CLUSTER", "MODEL", "INSTANCE TYPE", "NODES", "GPUS/NODE", "WORLD", "SHARDING",
              "ACT. CKPT", "EST. GIB/GPU")
    rows = [header] + [(p.name, p.cluster, p.model, p.instance_type, str(p.nodes), str(p.gpus_per_node),
                        str(p.world_size), p.sharding, p.trainer.parallelism.activation_checkpointing,
                        f"{p.est_gpu_memory_gib:.1f}") for p in plans]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = {4, 5, 6, 9}
    lines = ["  ".join(c.rjust(w) if i in numeric and r is not header else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
