"""At a Capacity Block's end the GPU nodes go to zero and stay there: the real Karpenter (kwok cloud
provider, the core of the release `generators/cluster.py --karpenter` installs) with the NodePools that
command writes, the real Kueue with the repository's queues, and the real `python -m trainer.block_queue`
with a block end a few seconds away.

A run admitted before the runs' stop time gets a node from zero (Karpenter answers its pending pods);
from the stop time on the queue holds, so a run applied then stays queued with no quota and no node is
started for it; the running run stops as the trainer stops at the block's end (its pods end with exit 1),
and Karpenter removes the node it no longer needs: no GPU node and no NodeClaim is left while the
queued run waits. (The node-group form, cluster-autoscaler, is not built here: see docs/operations.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from block_queue_support import (
    CLUSTER,
    admitted,
    end_stopping_in,
    run_docs,
    start_block_queue,
    stop_policy,
    workload_of,
)
from support import REPO_ROOT

from tools.cluster import dryrun, levels
from tools.cluster.cluster import Cluster
from tools.cluster.steps import karpenter

pytestmark = pytest.mark.cluster

POOL_LABEL = "karpenter.sh/nodepool"


@pytest.fixture(scope="module")
def karpenter_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The operator level with Kueue as fsdp-p5 ships it and Karpenter, fsdp-p5's configs, a CPU node,
    no GPU node, and the NodePools `generators/cluster.py matrix.yaml --karpenter` writes for fsdp-p5."""
    out = tmp_path_factory.mktemp("provisioning")
    subprocess.run(
        [sys.executable, "generators/cluster.py", "matrix.yaml", "--karpenter", "--out", str(out)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    generated = [yaml.safe_load(f.read_text()) for f in sorted((out / CLUSTER / "karpenter").glob("*.yaml"))]
    c = levels.start("operator", kueue=CLUSTER, karpenter=True)
    try:
        path = f"overlays/infrastructure/{CLUSTER}/configs"
        docs = [d for d in dryrun.render(REPO_ROOT, path) if d["kind"] != "Job"]
        dryrun.ensure_namespaces(c, {path: docs})
        c.apply(docs)
        (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
        c.add_shared_volume(pvc)
        c.add_cpu_node()
        c.apply(karpenter.node_pools(generated))
        yield c
    finally:
        c.stop()


def gpu_nodes(c: Cluster) -> list[str]:
    return [n["metadata"]["name"] for n in c.get("nodes")["items"] if POOL_LABEL in n["metadata"].get("labels", {})]


def node_claims(c: Cluster) -> list[str]:
    return [n["metadata"]["name"] for n in c.get("nodeclaims.karpenter.sh")["items"]]


def pods_of(c: Cluster, ns: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = c.get("pods", ns, selector=f"training.kubeflow.org/job-name={job}")["items"]
    return items


def stop_like_the_trainer(c: Cluster, pod: dict[str, Any]) -> None:
    """End a run pod as the trainer ends at the block's stop time: its container exits 1."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses = [
        {
            "name": s["name"],
            "image": s.get("image", ""),
            "imageID": s.get("imageID", ""),
            "ready": False,
            "restartCount": s.get("restartCount", 0),
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}},
        }
        for s in pod["status"].get("containerStatuses", [])
    ]
    patch = {"status": {"phase": "Failed", "containerStatuses": statuses}}
    meta = pod["metadata"]
    c.kubectl(
        "patch",
        "pod",
        "-n",
        meta["namespace"],
        meta["name"],
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


def test_at_the_block_end_the_queue_holds_the_running_run_stops_and_the_gpu_nodes_go_to_zero(
    karpenter_cluster: Cluster, tmp_path: Path
) -> None:
    c = karpenter_cluster
    assert gpu_nodes(c) == [] and node_claims(c) == []
    end_file = tmp_path / "end"
    end_file.write_text(end_stopping_in(45))
    log = tmp_path / "block-queue.log"
    proc = start_block_queue(c, tmp_path, end_file, log)
    docs = run_docs()
    (job,) = [d for d in docs if d["kind"] == "PyTorchJob"]
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    queued = json.loads(json.dumps(docs).replace(name, f"{name[:40]}-next"))
    next_name = f"{name[:40]}-next"
    try:
        # Before the stop time: the run is admitted and Karpenter brings it a node from zero.
        c.wait_for(lambda: "block-queue: holding" in log.read_text(), 60, "the queue hold process started")
        assert stop_policy(c) == "None", log.read_text()
        c.apply(docs)
        c.wait_for(lambda: admitted(workload_of(c, ns, name)), 60, "the run admitted before the stop time")
        c.wait_for(
            lambda: [p for p in pods_of(c, ns, name) if p["status"].get("phase") == "Running"],
            120,
            "the run's pod running on a node Karpenter started",
        )
        (pod,) = pods_of(c, ns, name)
        assert pod["spec"]["nodeName"] in gpu_nodes(c), (pod["spec"]["nodeName"], gpu_nodes(c))
        assert len(node_claims(c)) == 1
        # From the stop time on: held; a run applied now stays queued, holding no quota.
        c.wait_for(lambda: stop_policy(c) == "Hold", 90, "the queue held at the runs' stop time")
        c.apply(queued)
        c.wait_for(lambda: workload_of(c, ns, next_name), 60, "the queued run's Workload")
        # The running run stops as the trainer does at the stop time; its node is no longer needed.
        stop_like_the_trainer(c, pod)
        c.wait_for(lambda: gpu_nodes(c) == [] and node_claims(c) == [], 120, "the GPU nodes scaled to zero")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # nothing brings a node back for the queued run
            wl = workload_of(c, ns, next_name)
            assert not admitted(wl) and not (wl or {}).get("status", {}).get("admission"), wl
            assert gpu_nodes(c) == [] and node_claims(c) == []
            time.sleep(0.5)
        assert c.get("pytorchjob", ns, name=next_name)["spec"]["runPolicy"]["suspend"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for n in (name, next_name):
            c.kubectl("delete", "--ignore-not-found", "--wait=false", "-n", ns, "pytorchjob", n)
