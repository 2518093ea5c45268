"""Generate the EKS cluster definitions (eksctl, optionally Karpenter) from the experiment matrix.

    python generators/cluster.py matrix.yaml               # (re)write overlays/provisioning/
    python generators/cluster.py matrix.yaml --check       # exit 1 naming every file that would change
    python generators/cluster.py matrix.yaml --karpenter   # Karpenter NodePools instead of GPU node groups
    python generators/cluster.py matrix.yaml --out /tmp/provisioning

Then, per cluster: `eksctl create cluster -f overlays/provisioning/<cluster>/eksctl.yaml` (and with
--karpenter, `kubectl apply -f overlays/provisioning/<cluster>/karpenter/` once Karpenter runs).
These files create the cluster Flux is bootstrapped into, so they sit outside the Flux path.

What each cluster gets is described in generators/render/provisioning.py.

Output goes through the generators' one writer (generators/core/writer.py): banner naming this generator
and the matrix, sorted keys, byte-identical on every machine, stale files of removed clusters
deleted; files of generators/expand.py under the same directory are never touched. Bad input prints
one line on stderr naming the file, line, key and fix, exits 2 and writes nothing. Schema validation
of the output (eksctl's ClusterConfig schema, Karpenter's CRD schemas) is part of
`python generators/validate.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

# `python generators/cluster.py` runs the packages of the checkout it is in, never those of another checkout
# installed in the same environment (`pip install -e`): this checkout's root goes first on the import path.
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generators.core import writer
from generators.core.cli import errors_to_exit_codes, matrix_label, output_dir, owner, sync, version_option
from generators.matrix import Matrix, Run, expand, load
from generators.plan import ClusterPlan
from generators.plan.estimate import plan_fitting as plan
from generators.render import provisioning

# The checkout this command belongs to (a copy of the repository writes into itself).
REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR = "generators/cluster.py"
DEFAULT_OUT = REPO_ROOT / "overlays" / "provisioning"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("matrix", metavar="MATRIX")
@click.option(
    "--out",
    "out",
    metavar="DIR",
    default=None,
    help="Output directory (default: the repository's overlays/provisioning/).",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 naming every file that would change.")
@click.option("--karpenter", is_flag=True, help="Karpenter NodePools and EC2NodeClass instead of GPU node groups.")
@errors_to_exit_codes
def main(matrix: str, out: str | None, check: bool, karpenter: bool) -> None:
    """Write an eksctl ClusterConfig (and optionally Karpenter objects) for every cluster of MATRIX."""
    out_dir = output_dir(out, DEFAULT_OUT, REPO_ROOT)
    label = matrix_label(matrix, REPO_ROOT)

    m: Matrix = load(matrix)
    runs: list[Run] = expand(m)
    plans: list[ClusterPlan] = plan(m, runs)
    manifests: dict[str, Any] = provisioning.render(plans, karpenter)
    files: dict[str, bytes] = writer.serialize(manifests, label, generator=GENERATOR)

    rerun = f"python {GENERATOR} {matrix}" + (f" --out {out}" if out else "") + (" --karpenter" if karpenter else "")
    sync(
        out_dir,
        files,
        check=check,
        generator=GENERATOR,
        rerun=rerun,
        what=f"for {len(plans)} clusters",
        owner=owner("provisioning", matrix, REPO_ROOT),
    )


if __name__ == "__main__":
    main()
