"""The real Kueue (v0.16.2, tools/cluster/steps/kueue.py) configured by the repository's HelmRelease, on a
control plane of its own with the Training Operator and kwok nodes.

Running: a generated run of fsdp-p5 (queue label, run namespace) is suspended by Kueue's webhook on
creation, stays suspended while its ClusterQueue holds admission, and is admitted whole once it does not;
a run without the label, and a labelled run in a namespace Kueue does not select, are not touched.

Stopped (process killed, webhooks still registered, as when Kueue's pod is evicted or upgraded): a Job
and a Pod in kube-system and in monitoring, a Flux controller's Deployment with its pod, a Flux
Kustomization, the device-plugin DaemonSets with their pods, and the data staging Job of the run
namespace are all created; a run in the run namespace is refused by the API server (Kueue's
webhooks have failurePolicy Fail: the request fails, Flux applies it again at its next retry).

Mutation: the HelmRelease as it was (the chart's default values) makes the kube-system Job's creation
fail the same way, so the assertions above can fail.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.cluster import Cluster
from tools.cluster.steps import kueue

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLUSTER = "fsdp-p5"
INSTANCE = "p5.48xlarge"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def run_docs(nodes: int = 1) -> list[dict[str, Any]]:
    """The committed FULL_SHARD llama2-7b run of CLUSTER with `nodes` nodes, as Flux applies it."""
    (found,) = sorted((REPO_ROOT / "overlays" / "runs" / CLUSTER).glob(f"llama2-7b-*-n{nodes}-fullshard-*"))
    return dryrun.render(REPO_ROOT, str(found.relative_to(REPO_ROOT)))


def job_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in docs if d["kind"] == "PyTorchJob"]
    return job


def variant(name: str, namespace: str | None = None, label: bool = True) -> list[dict[str, Any]]:
    """The run renamed (and moved, or without its queue label), with its ConfigMap."""
    docs = copy.deepcopy(run_docs())
    job = job_of(docs)
    old = job["metadata"]["name"]
    text = yaml.safe_dump_all(docs).replace(old, name)
    docs = list(yaml.safe_load_all(text))
    for d in docs:
        if namespace:
            d["metadata"]["namespace"] = namespace
        if not label:
            d["metadata"].get("labels", {}).pop(QUEUE_LABEL, None)
    return docs


def suspended(cluster: Cluster, job: dict[str, Any]) -> bool | None:
    got = cluster.get("pytorchjob", job["metadata"]["namespace"], name=job["metadata"]["name"])
    return got["spec"].get("runPolicy", {}).get("suspend")


def workloads(cluster: Cluster, namespace: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        w
        for w in cluster.get("workloads.kueue.x-k8s.io", namespace)["items"]
        if any(o.get("name") == job["metadata"]["name"] for o in w["metadata"].get("ownerReferences", []))
    ]


def condition(obj: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), "")


def pods(cluster: Cluster, job: dict[str, Any]) -> list[dict[str, Any]]:
    return cluster.get(
        "pods", job["metadata"]["namespace"], selector=f"training.kubeflow.org/job-name={job['metadata']['name']}"
    )["items"]


def test_runs_are_queued_in_the_run_namespace_only(kcluster: Cluster) -> None:
    c = kcluster
    run = job_of(run_docs())
    ns = run["metadata"]["namespace"]
    assert run["metadata"]["labels"][QUEUE_LABEL] == "fsdp"
    namespace = c.get("namespace", name=ns)
    assert namespace["metadata"]["labels"].get("fsdp-gitops/kueue") == "managed"

    # Held: Kueue's webhook suspends the job on creation and its Workload waits for quota.
    c.kubectl("patch", "clusterqueue", "fsdp", "--type=merge", "-p", '{"spec":{"stopPolicy":"Hold"}}')
    c.apply(run_docs())
    assert suspended(c, run) is True
    wl = c.wait_for(lambda: workloads(c, ns, run), 60, "the run's Workload")
    assert condition(wl[0], "Admitted") != "True"
    assert pods(c, run) == []

    # Released: admitted whole, unsuspended, and the operator makes its pods.
    c.kubectl("patch", "clusterqueue", "fsdp", "--type=merge", "-p", '{"spec":{"stopPolicy":"None"}}')
    c.wait_for(lambda: condition(workloads(c, ns, run)[0], "Admitted") == "True", 120, "the run admitted")
    c.wait_for(lambda: suspended(c, run) is False, 60, "the run unsuspended")
    replicas = run["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    c.wait_for(lambda: len(pods(c, run)) == replicas, 120, "the admitted run's pods")

    # Not touched: no queue label in the run namespace; the label in a namespace Kueue does not select.
    c.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}}])
    untouched = [variant("unqueued-run", label=False), variant("elsewhere-run", namespace="elsewhere")]
    for docs in untouched:
        c.apply(docs)
    for docs in untouched:
        job = job_of(docs)
        where = job["metadata"]["namespace"]
        c.wait_for(lambda job=job: len(pods(c, job)) == replicas, 120, f"{where}/{job['metadata']['name']} pods")
        assert not suspended(c, job)
        assert workloads(c, where, job) == []


def create(c: Cluster, obj: dict[str, Any]) -> str:
    """'' if the API server creates `obj`, else its error."""
    res = c.kubectl_result("create", "-f", "-", stdin=yaml.safe_dump(obj))
    return "" if res.returncode == 0 else res.stderr.strip()


def job(name: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox:1.37", "command": ["true"]}],
                }
            }
        },
    }


def pod(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.37", "command": ["true"]}]},
    }


def outside_objects_refused(c: Cluster, suffix: str) -> dict[str, str]:
    """Create what must never wait on Kueue; returns object -> the API server's error, for each refused."""
    c.apply(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
            for n in ("monitoring", "flux-system", "device-plugins")
        ]
    )
    objects = {
        "Job kube-system": job(f"job-{suffix}", "kube-system"),
        "Pod kube-system": pod(f"pod-{suffix}", "kube-system"),
        "Job monitoring": job(f"job-{suffix}", "monitoring"),
        "Pod monitoring": pod(f"pod-{suffix}", "monitoring"),
        # What Flux's bootstrap and its reconciles create: controller Deployments and Kustomizations.
        "Deployment flux-system": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"source-controller-{suffix}", "namespace": "flux-system"},
            "spec": {
                "selector": {"matchLabels": {"app": f"source-controller-{suffix}"}},
                "template": {
                    "metadata": {"labels": {"app": f"source-controller-{suffix}"}},
                    "spec": {"containers": [{"name": "manager", "image": "ghcr.io/fluxcd/source-controller:v1.9.6"}]},
                },
            },
        },
        "Kustomization flux-system": {
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
            "kind": "Kustomization",
            "metadata": {"name": f"infra-{suffix}", "namespace": "flux-system"},
            "spec": {
                "interval": "1h",
                "path": "./",
                "prune": True,
                "sourceRef": {"kind": "GitRepository", "name": "fsdp-gitops"},
                "suspend": True,
            },
        },
        # The data staging Job of the run namespace carries no queue label (base/data-staging).
        "staging Job fsdp": job(f"staging-{suffix}", "fsdp"),
    }
    refused = {what: err for what, obj in objects.items() if (err := create(c, obj))}
    if "Deployment flux-system" not in refused:
        # The ReplicaSet controller creates the Deployment's pod: that create goes through the Pod webhook.
        def deployment_pod() -> bool:
            return bool(c.get("pods", "flux-system", selector=f"app=source-controller-{suffix}")["items"])

        try:
            c.wait_for(deployment_pod, 60, "the Flux Deployment's pod")
        except TimeoutError:
            events = c.kubectl("get", "events", "-n", "flux-system", "--field-selector", "reason=FailedCreate")
            refused["Deployment flux-system pod"] = events
    return refused


def device_plugins_placed(c: Cluster) -> list[str]:
    """The repository's device-plugin DaemonSets, applied; the GPU nodes each one's pods landed on."""
    plugins = [
        d
        for d in dryrun.render(REPO_ROOT, f"overlays/infrastructure/{CLUSTER}/controllers")
        if d["kind"] == "DaemonSet" and d["metadata"]["namespace"] == "device-plugins"
    ]
    c.apply(plugins)
    gpu_nodes = sorted(
        n["metadata"]["name"]
        for n in c.get("nodes")["items"]
        if n["metadata"]["labels"].get("node.kubernetes.io/instance-type") == INSTANCE
    )

    def placed() -> bool:
        for ds in plugins:
            selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
            if len(c.get("pods", "device-plugins", selector=selector)["items"]) < len(gpu_nodes):
                return False
        return True

    c.wait_for(placed, 120, "device-plugin pods on every GPU node")
    return gpu_nodes


def test_with_kueue_stopped_nothing_outside_the_runs_waits_for_it(kcluster: Cluster) -> None:
    c = kcluster
    kueue.stop(c)
    # The webhooks stay registered, pointing at a server that is gone.
    for kind, name in kueue.WEBHOOK_CONFIGURATIONS:
        assert c.get(kind, name=name)["webhooks"]
    assert not kueue.webhook_answers(c)

    assert outside_objects_refused(c, "stopped") == {}
    assert len(device_plugins_placed(c)) == 2

    # A run in the run namespace is refused (failurePolicy Fail), not created unsuspended.
    err = create(c, job_of(variant("run-while-kueue-is-down")))
    assert "failed calling webhook" in err and "mpytorchjob.kb.io" in err, err


def test_mutation_the_chart_defaults_make_kube_system_wait_for_kueue(kcluster: Cluster) -> None:
    c = kcluster
    unscoped = copy.deepcopy(kueue.repository_release(CLUSTER))
    del unscoped["spec"]["values"], unscoped["spec"]["postRenderers"]
    try:
        # The webhooks as the unscoped release renders them, with no Kueue serving (as at its first install).
        kueue.install(c, unscoped, webhook_port=1)
        refused = outside_objects_refused(c, "unscoped")
        assert "failed calling webhook" in refused.get("Job kube-system", ""), refused
        assert "mjob.kb.io" in refused["Job kube-system"]
        # Outside kube-system the chart's Pod and Deployment webhooks fail closed too.
        assert "mpod.kb.io" in refused.get("Pod monitoring", ""), refused
        assert "mdeployment.kb.io" in refused.get("Deployment flux-system", ""), refused
    finally:
        kueue.uninstall(c)
