"""Kueue and the TrainJob path: the real Kueue (tools/cluster/kueue.py), configured by the repository's
HelmRelease (which lists trainer.kubeflow.org/trainjob), on a control plane of its own with the real
Kubeflow Trainer and JobSet controllers (the fixtures of test_cluster_trainjob.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cluster_trainjob import JOBSET_LABEL, cluster, condition, configs, delete, runs, tree

from tools.cluster import dryrun
from tools.cluster.harness import Cluster

pytestmark = pytest.mark.cluster
__all__ = ["cluster", "configs", "tree"]  # the fixtures this module uses


def test_kueue_admits_a_trainjob_as_one_gang(cluster: Cluster, tree: Path, configs: Any) -> None:
    """Kueue suspends a queued TrainJob, admits it whole within the cluster's quota and lets the Trainer
    make its JobSet."""
    from tools.cluster import kueue

    kueue.start(cluster)
    (path,) = [r for r in runs(tree) if "-n2-" in r]
    docs = dryrun.render(tree, path)
    (job,) = [d for d in docs if d["kind"] == "TrainJob"]
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    cluster.apply(docs)
    try:

        def admitted() -> dict[str, Any] | None:
            for w in cluster.get("workloads.kueue.x-k8s.io", ns)["items"]:
                owners = {o["name"] for o in w["metadata"].get("ownerReferences", [])}
                if name in owners and (condition(w, "Admitted") or {}).get("status") == "True":
                    return w
            return None

        workload = cluster.wait_for(admitted, 240, "Kueue admitting the TrainJob")
        (owner,) = workload["metadata"]["ownerReferences"]
        assert owner["kind"] == "TrainJob"
        assert sum(ps["count"] for ps in workload["spec"]["podSets"]) == 2
        # Admitted: Kueue lifts the suspension and the Trainer makes the JobSet of the whole gang.
        cluster.wait_for(
            lambda: (
                cluster.get("trainjob", ns, name=name)["spec"].get("suspend") is False
                and cluster.kubectl_result("get", "jobset", "-n", ns, name).returncode == 0
            ),
            120,
            "the admitted TrainJob running its JobSet",
        )
        (k8s_job,) = cluster.get("jobs", ns, selector=f"{JOBSET_LABEL}={name}")["items"]
        assert k8s_job["spec"]["parallelism"] == 2
    finally:
        delete(cluster, ns, name)
        kueue.stop(cluster)
        kueue.uninstall(cluster)
