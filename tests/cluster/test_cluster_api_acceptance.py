"""Level 1: every overlay Flux applies is accepted by a real kube-apiserver with the pinned CRDs,
and the same check rejects broken manifests, naming the overlay and quoting the API server."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_overlay_paths_cover_runs_infrastructure_and_cluster_entry_points() -> None:
    paths = dryrun.overlay_paths(REPO_ROOT)
    runs = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "overlays" / "runs").glob("*/*") if p.is_dir())
    clusters = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "overlays" / "clusters").iterdir())
    assert runs and set(runs) <= set(paths)
    assert clusters and set(clusters) <= set(paths)
    infrastructure = {
        str(k.parent.relative_to(REPO_ROOT))
        for k in (REPO_ROOT / "overlays" / "infrastructure").glob("*/*/kustomization.yaml")
    }
    assert {f"overlays/infrastructure/{Path(c).name}/controllers" for c in clusters} <= infrastructure
    assert {p for p in paths if p.startswith("overlays/infrastructure/")} == infrastructure
    assert not [p for p in paths if p.startswith("overlays/provisioning")]  # eksctl input, not objects


def test_every_overlay_is_accepted_by_the_api_server(cluster: Cluster) -> None:
    assert dryrun.server_dry_run(cluster, REPO_ROOT) == []


def _copy_repo(dst: Path) -> None:
    for part in ("base", "overlays"):
        shutil.copytree(REPO_ROOT / part, dst / part)


# JSON patch operations appended to a run's patch, and what the API server answers.
MUTATIONS = {
    "unknown field": (
        '- op: add\n  path: /spec/nprocPerNodeX\n  value: "8"\n',
        ".spec.nprocPerNodeX: field not declared in schema",
    ),
    "wrong type": ("- op: replace\n  path: /spec/pytorchReplicaSpecs/Worker/replicas\n  value: two\n", "replicas"),
    "missing required field": (
        "- op: remove\n  path: /spec/pytorchReplicaSpecs/Worker/template/spec/containers\n",
        "containers: Required value",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_broken_run_is_rejected_with_the_overlay_path_and_the_servers_message(
    cluster: Cluster, tmp_path: Path, mutation: str
) -> None:
    _copy_repo(tmp_path)
    run = sorted(p for p in (tmp_path / "overlays" / "runs").glob("*/*") if p.is_dir())[0]
    op, message = MUTATIONS[mutation]
    with open(run / "pytorchjob.run.yaml", "a") as f:
        f.write(op)
    rel = str(run.relative_to(tmp_path))
    problems = dryrun.server_dry_run(cluster, tmp_path, [rel])
    assert problems, f"{mutation}: the API server accepted it"
    assert all(p.startswith(f"{rel}: ") for p in problems), problems
    assert message in "\n".join(problems), problems
    assert f'pytorchjob.kubeflow.org "{run.name}"' in "\n".join(problems) or run.name in "\n".join(problems)


def test_broken_flux_kustomization_in_a_cluster_entry_point_is_rejected(cluster: Cluster, tmp_path: Path) -> None:
    _copy_repo(tmp_path)
    entry = (
        tmp_path / "overlays" / "clusters" / sorted(p.name for p in (REPO_ROOT / "overlays" / "clusters").iterdir())[0]
    )
    text = (entry / "infrastructure.yaml").read_text()
    (entry / "infrastructure.yaml").write_text(text.replace("  prune: true", "  prune: yes-please", 1))
    rel = str(entry.relative_to(tmp_path))
    problems = dryrun.server_dry_run(cluster, tmp_path, [rel])
    assert problems and all(p.startswith(f"{rel}: ") for p in problems), problems
    assert "prune" in "\n".join(problems), problems
