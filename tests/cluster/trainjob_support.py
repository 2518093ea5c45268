"""What the TrainJob modules on the operator level share: the two-API example's tree, its trainjob
cluster's configs applied, and the level they run on (the Training Operator's place taken by the
Kubeflow Trainer and JobSet; kwok leaves pods running until the test ends them)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO_ROOT

from generators import matrix
from generators.core import writer
from generators.plan import plan
from generators.render import OVERLAYS, render
from tools.cluster import dryrun, levels
from tools.cluster.cluster import Cluster

EXAMPLE = REPO_ROOT / "examples" / "matrix-two-apis.yaml"
CLUSTER = "fsdp-p5"
INSTANCE = "p5.48xlarge"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The level of the TrainJob modules: a trainjob cluster needs no Training Operator, and a trainer pod
# runs until the test says how it ends (kwok's pod-complete stage off).
TRAINJOB_LEVEL = {"training_operator": False, "pods_complete": False, "trainjob": True}


def trainjob_level(**options: Any) -> Iterator[Cluster]:
    """The operator level with TRAINJOB_LEVEL and `options`, stopped after the module."""
    c = levels.start("operator", **TRAINJOB_LEVEL, **options)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base/ and the example's overlays in a git work tree."""
    root = tmp_path_factory.mktemp("two-apis")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shutil.copytree(REPO_ROOT / "base", root / "base")
    shutil.copy(EXAMPLE, root / "matrix.yaml")
    m = matrix.load(str(root / "matrix.yaml"))
    for rel, data in writer.serialize(render(plan(m, matrix.expand(m)), OVERLAYS), "matrix.yaml").items():
        path = root / "overlays" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def runs(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in (tree / "overlays" / "runs" / CLUSTER).iterdir())


@pytest.fixture(scope="module")
def configs(cluster: Cluster, tree: Path) -> list[dict[str, Any]]:
    """The trainjob cluster's configs applied (run namespace, shared volume, queues, the runtime), its
    shared volume bound, and two fake p5.48xlarge nodes."""
    path = f"overlays/infrastructure/{CLUSTER}/configs"
    # Without the NCCL pre-flight Jobs: they would hold the fake GPU nodes (kwok never ends a pod here).
    docs = [d for d in dryrun.render(tree, path) if d["kind"] != "Job"]
    dryrun.ensure_namespaces(cluster, {path: docs})
    cluster.apply(docs)
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    cluster.add_shared_volume(pvc)
    cluster.add_gpu_nodes(INSTANCE, 2)
    return docs


def pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return sorted(
        cluster.get("pods", ns, selector=f"{JOBSET_LABEL}={name}")["items"], key=lambda p: p["metadata"]["name"]
    )


def delete(cluster: Cluster, ns: str, name: str) -> None:
    cluster.kubectl("delete", "trainjob", "-n", ns, name, "--wait=false")
    cluster.wait_for(
        lambda: not pods(cluster, ns, name) and cluster.kubectl_result("get", "trainjob", "-n", ns, name).returncode,
        180,
        "the TrainJob and its pods gone",
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)
