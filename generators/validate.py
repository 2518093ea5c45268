"""Validate the repository the way CI and the cluster see it.

    python generators/validate.py                       # the whole repository
    python generators/validate.py overlays/runs/fsdp-p5 # only what lies under the given paths
    python generators/validate.py --crd-schemas DIR --k8s-version 1.33.0
    python generators/validate.py --server              # also a server-side dry-run against a real API server

Steps, in order. Each problem is one line `<file>[:<line>]: <Kind>/<name>: <message>` on stderr, a
summary goes to stdout; exit 1 when there is any problem, 2 on bad options (one line).

1. Parse every YAML file git knows about (tracked, or untracked and not ignored): syntax errors and
   duplicate keys, with the line.
2. `kustomize build --load-restrictor=LoadRestrictionsNone` every kustomization, as kustomize-controller
   builds it (two at a time). Components are built through the kustomizations that use them; a
   Component nothing uses is built through an empty parent.
3. One `kubeconform -strict` over every build output and every plain manifest file (YAML outside
   kustomizations that holds objects), with core schemas prepared from the `kubernetes-validate`
   package for one pinned Kubernetes version (K8S_VERSION) and CRD schemas from --crd-schemas. A kind
   without a schema is an error. Documents that are inputs of tools rather than cluster objects (the
   matrix, kustomize's own files, eksctl's ClusterConfig) go by NON_CLUSTER_SCHEMAS instead.
4. The Flux graph of every bootstrap directory (generators/validation/fluxgraph.py): paths exist and build,
   dependsOn and sources resolve, no cycle, no object applied by two Kustomizations.
5. Semantic checks no schema can make (generators/validation/semantics.py): GPUs and EFA against the instance
   type, torchrun's processes per node, unique rendezvous ids and output directories, no privileged
   training pod, no `latest` or untagged image, no inline secret, no unencrypted Secret.

6. The experiment matrix (matrix.yaml at the repository root, when the whole repository is validated or
   the matrix is one of PATHS), planned as `expand.py` plans it: every cluster's shared volume must hold
   what its runs keep there at the fullest (generators/plan/footprint.py). A matrix that overflows a
   volume is refused before the other steps, in one line naming its shared_storage_gib, the largest runs
   and the fix, exit 2.

7. With --server: every overlay Flux applies (under PATHS) is sent with `kubectl apply --dry-run=server
   --server-side` to a real kube-apiserver with the pinned CRDs, started on loopback and stopped
   afterwards (tools/cluster/dryrun.py; the first run builds the API server: minutes). Problems are
   `<overlay path>: <the API server's message>`.

The steps live in generators/validation/ (index.py: files and builds; schemas.py: kubeconform;
pipeline.py: the order). A problem in a build names the input file that set the offending field (the overlay's own patch
before its bases), and a mistake in a base that shows in every build using it is reported once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

# `python generators/validate.py` runs the packages of the checkout it is in, never those of another checkout
# installed in the same environment (`pip install -e`): this checkout's root goes first on the import path.
if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generators.core.cli import Failure, errors_to_exit_codes, version_option
from generators.plan.footprint import check_matrix_file
from generators.validation.pipeline import Report, repository_root, validate
from generators.validation.schemas import CRD_SCHEMAS_ENV, K8S_VERSION, cluster_tools, default_crd_dir

# The experiment matrix at the repository root (step 6).
MATRIX = "matrix.yaml"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.option(
    "--crd-schemas",
    "crd_schemas",
    type=click.Path(path_type=Path),
    default=None,
    help=f"CRD JSON schemas in the {{group}}/{{kind}}_{{version}}.json layout "
    f"[default: ${CRD_SCHEMAS_ENV}, else generated from the pinned CRDs into .tools/schemas/crds]",
)
@click.option(
    "--k8s-version",
    default=K8S_VERSION,
    show_default=True,
    help="Kubernetes version of the core schemas (from the kubernetes-validate package).",
)
@click.option(
    "--server",
    is_flag=True,
    help="Also dry-run every overlay Flux applies against a real kube-apiserver with the pinned CRDs.",
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@errors_to_exit_codes
def main(crd_schemas: Path | None, k8s_version: str, server: bool, paths: tuple[Path, ...]) -> None:
    """Validate the repository (or PATHS in it): YAML, kustomize builds, schemas, Flux graph, semantics."""
    root: Path = repository_root(paths, default=Path(__file__).resolve().parent.parent)
    rel = [os.path.relpath(p.resolve(), root) for p in paths]
    matrix = root / MATRIX
    if matrix.is_file() and (not paths or MATRIX in rel):
        check_matrix_file(os.path.relpath(matrix))
    report: Report = validate(
        root, rel, crd_dir=(crd_schemas or default_crd_dir(root)).resolve(), k8s_version=k8s_version
    )
    for p in report.problems:
        click.echo(str(p), err=True)
    status = f"{len(report.problems)} problem(s)" if report.problems else "OK"
    click.echo(
        f"validated {report.num_yaml_files} YAML files, {report.num_builds} kustomize builds, "
        f"{report.num_resources} resources, {report.num_flux_kustomizations} Flux Kustomizations, "
        f"{report.num_pytorchjobs} PyTorchJobs "
        f"in {report.seconds:.1f}s: {status}"
    )
    server_problems: list[str] = []
    if server:
        # A real API server on loopback: started only when asked (tools/cluster/dryrun.py).
        checked, server_problems = cluster_tools("dryrun").server_problems(root, rel)
        for line in server_problems:
            click.echo(line, err=True)
        click.echo(
            f"server-side dry-run of {checked} overlays: "
            f"{f'{len(server_problems)} problem(s)' if server_problems else 'OK'}"
        )
    if report.problems or server_problems:
        raise Failure("")  # the problems and the summary are printed above


if __name__ == "__main__":
    main()
