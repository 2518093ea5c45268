"""Why a trainjob cluster runs without Kueue, proven against the real parts: the real Kueue
(tools/cluster/steps/kueue.py, configured by the repository's HelmRelease, which lists
trainer.kubeflow.org/trainjob) on a control plane of its own with the real Kubeflow Trainer and JobSet
controllers (tests/cluster/trainjob_support.py).

The pinned Kueue is built against Kubeflow Trainer v2.1 types. On admission it writes the TrainJob back
with them, and the fields newer Trainers added (runtimePatches, where the run's pod settings are) are
gone: the Trainer then rebuilds a different JobSet, which JobSet's webhook refuses as immutable, so the
JobSet stays suspended while the run's quota stays held. The matrix therefore refuses `kueue: true` on a
trainjob cluster (generators/matrix/load.py, docs/job-api.md). This test is the watch on that: when a
Kueue release keeps the runtimePatches, it fails, and the refusal can be lifted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT
from trainjob_support import condition, configs, delete, runs, trainjob_level, tree

from generators.render.runs import QUEUE_LABEL
from tools.cluster import dryrun
from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster
__all__ = ["configs", "tree"]  # the shared fixtures this module uses


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The TrainJob level with the real Kueue as the repository ships it (the level option `kueue`)."""
    yield from trainjob_level(kueue=True)


QUEUES = REPO_ROOT / "base" / "components" / "kueue" / "queues" / "queues.yaml"


def test_the_pinned_kueue_drops_a_trainjobs_runtime_patches_on_admission(
    cluster: Cluster, tree: Path, configs: Any
) -> None:
    (path,) = [r for r in runs(tree) if "-n2-" in r]
    docs = dryrun.render(tree, path)
    (job,) = [d for d in docs if d["kind"] == "TrainJob"]
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    assert QUEUE_LABEL not in job["metadata"]["labels"]  # what the generator renders on a trainjob cluster
    assert job["spec"]["runtimePatches"], "the rendered TrainJob carries its pod settings as runtimePatches"
    # Queued by hand, as `kueue: true` would have done: the repository's queues, in the run namespace.
    job["metadata"]["labels"][QUEUE_LABEL] = "fsdp"
    queues = [d for d in yaml.safe_load_all(QUEUES.read_text()) if d]
    for d in queues:
        if d["kind"] == "LocalQueue":
            d["metadata"]["namespace"] = ns
    cluster.kubectl("label", "namespace", ns, "fsdp-gitops/kueue=managed", "--overwrite")
    cluster.apply(queues)
    cluster.apply(docs)
    try:

        def admitted() -> dict[str, Any] | None:
            for w in cluster.get("workloads.kueue.x-k8s.io", ns)["items"]:
                owners = {o["name"] for o in w["metadata"].get("ownerReferences", [])}
                if name in owners and (condition(w, "Admitted") or {}).get("status") == "True":
                    return w
            return None

        workload = cluster.wait_for(admitted, 240, "Kueue admitting the TrainJob")
        assert sum(ps["count"] for ps in workload["spec"]["podSets"]) == 2
        stored = cluster.wait_for(
            lambda: (t := cluster.get("trainjob", ns, name=name))["spec"].get("suspend") is False and t,
            120,
            "Kueue lifting the TrainJob's suspension",
        )
        assert "runtimePatches" not in stored["spec"], (
            "Kueue kept the TrainJob's runtimePatches on admission: a trainjob cluster may queue with Kueue"
            " again (lift the refusal in generators/matrix/load.py and update docs/job-api.md)"
        )
    finally:
        delete(cluster, ns, name)
        cluster.kubectl("delete", "--ignore-not-found", "-f", str(QUEUES))
