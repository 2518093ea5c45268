"""Observability objects on the real control plane with the Training Operator and kwok nodes
(tests/cluster/conftest.py): the pods the operator makes for a generated run are exactly the ones its
progress Role names, and a cluster's NCCL pre-flight Job puts its two pods on two different nodes,
addressable through its headless Service, and completes.

It uses the fsdp-p4de cluster's committed overlays on fake p4de nodes of its own, so it shares
nothing with the p5 pool of test_cluster_operator.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster

CLUSTER = "fsdp-p4de"
INSTANCE = "p4de.24xlarge"
NS = "fsdp"


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.fixture(scope="module")
def p4de_nodes(cluster: Cluster) -> list[str]:
    if not cluster.kubectl_result("get", "namespace", NS).returncode == 0:
        cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    if cluster.kubectl_result("get", "pvc", "-n", NS, "fsdp-shared").returncode != 0:
        configs = dryrun.render(REPO_ROOT, f"overlays/infrastructure/{CLUSTER}/configs")
        pvc = only(configs, "PersistentVolumeClaim")
        cluster.apply([pvc])
        cluster.add_shared_volume(pvc)
    return cluster.add_gpu_nodes(INSTANCE, 3)


def test_run_pods_are_the_pods_its_progress_role_may_patch(cluster: Cluster, p4de_nodes: list[str]) -> None:
    (run,) = sorted((REPO_ROOT / "overlays" / "runs" / CLUSTER).glob("llama2-7b-*-n2-fullshard-*"))
    docs = dryrun.render(REPO_ROOT, str(run.relative_to(REPO_ROOT)))
    job, role = only(docs, "PyTorchJob"), only(docs, "Role")
    name = job["metadata"]["name"]
    cluster.apply(docs)
    try:
        pods = cluster.wait_for(
            lambda: (lambda items: items if len(items) == 2 else None)(
                cluster.get("pods", NS, selector=f"training.kubeflow.org/job-name={name}")["items"]
            ),
            180,
            "the run's pods",
        )
        (rule,) = role["rules"]
        assert sorted(p["metadata"]["name"] for p in pods) == sorted(rule["resourceNames"])
        for pod in pods:
            assert pod["spec"]["serviceAccountName"] == name
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            assert env["FSDP_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    finally:
        cluster.kubectl("delete", "pytorchjob", "-n", NS, name, "--wait=false")


def test_preflight_job_runs_two_pods_on_two_nodes_and_completes(cluster: Cluster, p4de_nodes: list[str]) -> None:
    docs = dryrun.render(REPO_ROOT, f"overlays/infrastructure/{CLUSTER}/configs/preflight-p4de")
    job = only(docs, "Job")
    name = job["metadata"]["name"]
    assert name == "fsdp-preflight-p4de"
    cluster.apply(docs)
    try:
        done = cluster.wait_for(
            lambda: (lambda j: j if j.get("status", {}).get("succeeded") == 2 else None)(
                cluster.get("job", NS, name=name)
            ),
            180,
            "the pre-flight Job complete",
        )
        assert done["status"].get("failed", 0) == 0
        pods = cluster.get("pods", NS, selector=f"batch.kubernetes.io/job-name={name}")["items"]
        assert len(pods) == 2
        # Two different p4de nodes (the anti-affinity), and each pod is <job>-<index> under the Service.
        nodes = {p["spec"]["nodeName"] for p in pods}
        assert len(nodes) == 2 and nodes <= set(p4de_nodes)
        assert sorted(p["spec"]["hostname"] for p in pods) == [f"{name}-0", f"{name}-1"]
        assert {p["spec"]["subdomain"] for p in pods} == {name}
        svc = cluster.get("service", NS, name=name)
        assert svc["spec"]["clusterIP"] == "None"
        assert all(svc["spec"]["selector"].items() <= p["metadata"]["labels"].items() for p in pods)
    finally:
        cluster.kubectl("delete", "-n", NS, "job", name, "--wait=false")
        cluster.kubectl("delete", "-n", NS, "service", name, "--wait=false")
