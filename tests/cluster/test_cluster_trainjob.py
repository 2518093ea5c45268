"""The TrainJob path against the real Kubeflow Trainer v2.3.0 and JobSet v0.12.0 controllers (kwok level).

A control plane of its own (API server, scheduler, controller manager, kwok nodes shaped like
p5.48xlarge) runs the two controllers built from tools/cluster/go/kubeflow-trainer
(tools/cluster/steps/trainer.py: their upstream webhooks by URL, their own certificate rotators).
The example matrix with one cluster on each job API (examples/matrix-two-apis.yaml) is rendered by
the real generator; its trainjob cluster's overlays are accepted by a server-side dry-run with the
controllers' webhooks; a generated TrainJob becomes a JobSet, its Jobs and their pods, placed on the
fake GPU nodes, whose container carries the torch plugin's settings and everything the run's TrainJob
and the project's runtime say; and the failure policy does what base/trainjob/runtime.yaml promises:
exit 2 fails the TrainJob at once, exit 143 restarts the whole gang.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainjob_support import (
    CLUSTER,
    INSTANCE,
    JOBSET_LABEL,
    condition,
    configs,
    delete,
    pods,
    runs,
    trainjob_level,
    tree,
)

from tools.cluster import dryrun
from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster
__all__ = ["configs", "tree"]  # the shared fixtures this module uses


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from trainjob_level()


def test_the_trainjob_overlays_pass_a_server_side_dry_run(cluster: Cluster, tree: Path, configs: Any) -> None:
    paths = [f"overlays/infrastructure/{CLUSTER}/configs", *runs(tree)]
    assert dryrun.server_dry_run(cluster, tree, paths) == []


def test_the_trainers_webhook_refuses_a_trainjob_that_sets_the_torch_settings_itself(
    cluster: Cluster, tree: Path, configs: Any
) -> None:
    (job,) = [d for d in dryrun.render(tree, runs(tree)[0]) if d["kind"] == "TrainJob"]
    job["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "4"})
    res = cluster.kubectl_result("apply", "--dry-run=server", "--server-side", "-f", "-", stdin=yaml.safe_dump(job))
    assert res.returncode != 0
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in res.stderr, res.stderr
    assert "must not have reserved envs" in res.stderr and "PET_NNODES" in res.stderr, res.stderr


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_a_trainjob_becomes_a_jobset_jobs_and_pods_with_the_torch_settings(
    cluster: Cluster, tree: Path, configs: Any
) -> None:
    (path,) = [r for r in runs(tree) if "-n2-" in r]
    docs = dryrun.render(tree, path)
    (job,) = [d for d in docs if d["kind"] == "TrainJob"]
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    cluster.apply(docs)
    try:
        placed = cluster.wait_for(
            lambda: (
                lambda ps: ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps) else None
            )(pods(cluster, ns, name)),
            240,
            "the TrainJob's two pods running",
        )
        jobset = cluster.get("jobset", ns, name=name)
        policy = jobset["spec"]["failurePolicy"]
        assert policy["maxRestarts"] == 10 and policy["restartStrategy"] == "BlockingRecreate"
        (rjob,) = jobset["spec"]["replicatedJobs"]
        assert rjob["name"] == "node" and rjob["template"]["spec"]["backoffLimit"] == 0
        (k8s_job,) = cluster.get("jobs", ns, selector=f"{JOBSET_LABEL}={name}")["items"]
        assert k8s_job["spec"]["parallelism"] == k8s_job["spec"]["completions"] == 2
        assert k8s_job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [1, 2]
        service = cluster.get("service", ns, name=name)
        assert service["spec"]["clusterIP"] == "None"
        trainer = job["spec"]["trainer"]
        for i, pod in enumerate(placed):
            spec = pod["spec"]
            (c,) = spec["containers"]
            env = env_of(c)
            assert c["name"] == "node"
            assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "8"
            assert env["PET_NODE_RANK"] == {
                "fieldRef": {
                    "apiVersion": "v1",
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                }
            }
            assert env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}" and env["PET_MASTER_PORT"] == "29500"
            # The generated command names the same host as the plugin's master address.
            assert f"--rdzv-endpoint={env['PET_MASTER_ADDR']}:29400" in c["command"]
            assert c["command"] == trainer["command"]
            assert env["FI_PROVIDER"] == "efa" and env["HF_TOKEN_FILE"] == "/etc/hf-token/token"
            assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
            assert spec["hostname"] == f"{name}-node-0-{i}" and spec["subdomain"] == name
            assert spec["serviceAccountName"] == name
            assert spec["nodeSelector"]["node.kubernetes.io/instance-type"] == INSTANCE
            assert spec["securityContext"]["runAsUser"] == 10001 and spec["restartPolicy"] == "Never"
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["train-config"]["configMap"]["name"] == f"{name}-config"
            assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
            (wait,) = spec["initContainers"]
            assert env_of(wait)["DATA_MARKER"] == "/shared/data/samsum/_COMPLETE"
            assert pod["metadata"]["labels"]["fsdp-gitops/run"] == name
            assert (
                cluster.get("node", name=spec["nodeName"])["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                == INSTANCE
            )
    finally:
        delete(cluster, ns, name)


def fail_pod(cluster: Cluster, pod: dict[str, Any], exit_code: int) -> None:
    """What a kubelet reports when the node container exits with `exit_code` (kwok plays the kubelet)."""
    (c,) = pod["spec"]["containers"]
    status = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}},
                }
            ],
        }
    }
    cluster.kubectl(
        "patch", "pod", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip


@pytest.mark.parametrize("exit_code", [2, 143])
def test_the_failure_policy_fails_a_bad_config_at_once_and_restarts_the_gang_after_sigterm(
    cluster: Cluster, tree: Path, configs: Any, exit_code: int
) -> None:
    (path,) = [r for r in runs(tree) if "-n2-" in r]
    docs = dryrun.render(tree, path)
    (job,) = [d for d in docs if d["kind"] == "TrainJob"]
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    cluster.apply(docs)
    try:
        first = cluster.wait_for(
            lambda: (
                lambda ps: ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps) else None
            )(pods(cluster, ns, name)),
            240,
            "the TrainJob's two pods running",
        )
        fail_pod(cluster, first[1], exit_code)
        if exit_code == 2:
            failed = cluster.wait_for(
                lambda: condition(cluster.get("trainjob", ns, name=name), "Failed"), 180, "the TrainJob failed"
            )
            assert failed["status"] == "True", failed
            jobset = cluster.get("jobset", ns, name=name)
            assert jobset["status"].get("restarts", 0) == 0, jobset["status"]
            # The runtime's only FailJobSet rule is ConfigurationError (a Job failed by its podFailurePolicy).
            assert jobset["status"]["terminalState"] == "Failed", jobset["status"]
            assert "applying FailJobSet failure policy action" in json.dumps(jobset["status"]), jobset["status"]
        else:
            restarted = cluster.wait_for(
                lambda: (lambda js: js if js["status"].get("restarts", 0) >= 1 else None)(
                    cluster.get("jobset", ns, name=name)
                ),
                180,
                "the JobSet restarted the gang",
            )
            assert restarted["status"]["restarts"] == 1
            old = {p["metadata"]["uid"] for p in first}
            cluster.wait_for(
                lambda: (lambda ps: len(ps) == 2 and not old & {p["metadata"]["uid"] for p in ps})(
                    pods(cluster, ns, name)
                ),
                240,
                "a new gang of two pods",
            )
            assert condition(cluster.get("trainjob", ns, name=name), "Failed") is None
    finally:
        delete(cluster, ns, name)
