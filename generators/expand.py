"""Expand an experiment matrix into one kustomize overlay per run, plus each cluster's Flux entry.

    python generators/expand.py matrix.yaml            # (re)write overlays/
    python generators/expand.py matrix.yaml --check    # exit 1 naming every file that would change
    python generators/expand.py matrix.yaml --list     # table of the runs, writes nothing
    python generators/expand.py matrix.yaml --out /tmp/overlays

Bad input (the matrix or the options) prints one line on stderr naming the file, line, key and fix,
and exits 2 without touching the output directory; other failures exit 1. The matrix format is
described in generators/matrix.py and README.md.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as `python generators/expand.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

import click  # noqa: E402

from generators import matrix as matrix_mod  # noqa: E402
from generators import writer  # noqa: E402
from generators.cli import bad_input, matrix_label, output_dir, sync  # noqa: E402
from generators.errors import MatrixError  # noqa: E402
from generators.model import Plan  # noqa: E402
from generators.plan import plan  # noqa: E402
from generators.render import render  # noqa: E402
from generators.writer import GENERATOR  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "overlays"


def format_table(plans: list[Plan]) -> str:
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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("matrix", metavar="MATRIX")
@click.option("--out", "out", metavar="DIR", default=None,
              help="Output directory (default: the repository's overlays/).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 naming every file that would change.")
@click.option("--list", "list_runs", is_flag=True, help="Print a table of the runs; write nothing.")
def main(matrix: str, out: str | None, check: bool, list_runs: bool) -> None:
    """Expand MATRIX (an experiment matrix, e.g. matrix.yaml) into kustomize overlays."""
    if check and list_runs:
        bad_input("--check and --list: choose one; fix: drop one of the two options")
    out_dir = output_dir(out, DEFAULT_OUT)
    label = matrix_label(matrix)
    try:
        m = matrix_mod.load(matrix)
        plans = plan(m)
        if list_runs:
            click.echo(format_table(plans))
            return
        root_from_out = Path(os.path.relpath(REPO_ROOT, out_dir.resolve())).as_posix()
        files = writer.serialize(render(m, plans, root_from_out), label)
    except MatrixError as err:
        bad_input(str(err))
        return
    sync(out_dir, files, check=check, generator=GENERATOR,
         rerun=f"python {GENERATOR} {matrix}" + (f" --out {out}" if out else ""), what=f"for {len(plans)} runs")


if __name__ == "__main__":
    main()
