"""Level 2: the real Training Operator turns generated PyTorchJobs into pods and services that the
real scheduler places on fake nodes shaped like the catalog's instance types (kwok).

The fake pool has 16 p5.48xlarge nodes that advertise GPUs and EFA, plus one p5.48xlarge whose
device plugins have not registered (no nvidia.com/gpu) and one CPU node: the 1- and 2-node runs fit
beside each other, the 16-node run then fits only partly (the scheduler reports the missing GPUs and
never uses the node without them) and runs completely once the others are deleted. The cluster's
device-plugin DaemonSets land on every GPU node and on no other.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.cluster import Cluster
from trainer.catalog import INSTANCE_TYPES

pytestmark = pytest.mark.cluster

CLUSTER = "fsdp-p5"
INSTANCE = "p5.48xlarge"
POOL = 16
JOB_LABEL = "training.kubeflow.org/job-name"


def run_dir(nodes: int) -> str:
    """The committed FULL_SHARD llama2-7b run of CLUSTER with `nodes` nodes."""
    found = sorted((REPO_ROOT / "overlays" / "runs" / CLUSTER).glob(f"llama2-7b-*-n{nodes}-fullshard-*"))
    assert len(found) == 1, found
    return str(found[0].relative_to(REPO_ROOT))


def job_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in docs if d["kind"] == "PyTorchJob"]
    return job


def job_problems(cluster: Cluster, job: dict[str, Any]) -> list[str]:
    """What is wrong with the pods and services the operator made for `job` (the generated object)."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    replicas = worker["replicas"]
    tmpl = worker["template"]["spec"]
    instance = INSTANCE_TYPES[tmpl["nodeSelector"]["node.kubernetes.io/instance-type"]]
    pods = sorted(cluster.get("pods", ns, selector=f"{JOB_LABEL}={name}")["items"], key=lambda p: p["metadata"]["name"])
    services = {s["metadata"]["name"]: s for s in cluster.get("services", ns, selector=f"{JOB_LABEL}={name}")["items"]}
    nodes = {n["metadata"]["name"]: n for n in cluster.get("nodes")["items"]}
    problems = []
    if len(pods) != replicas:
        problems.append(f"{len(pods)} pods for {replicas} replicas")
    for pod in pods:
        pname, spec = pod["metadata"]["name"], pod["spec"]
        c = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if env.get("PET_NNODES") != str(replicas):
            problems.append(f"{pname}: PET_NNODES={env.get('PET_NNODES')}, want {replicas}")
        if env.get("PET_NPROC_PER_NODE") != str(instance.num_gpus):
            problems.append(f"{pname}: PET_NPROC_PER_NODE={env.get('PET_NPROC_PER_NODE')}, want {instance.num_gpus}")
        endpoint = next((a.split("=", 1)[1] for a in c["command"] if a.startswith("--rdzv-endpoint=")), "")
        host, _, port = endpoint.rpartition(":")
        svc = services.get(host)
        if svc is None:
            problems.append(
                f"{pname}: --rdzv-endpoint host {host!r} is not a Service the operator created ({sorted(services)})"
            )
        else:
            target = next((p for p in pods if svc["spec"]["selector"].items() <= p["metadata"]["labels"].items()), None)
            if target is None or not target["metadata"]["name"].endswith("-worker-0"):
                problems.append(f"{pname}: Service {host} does not select worker 0")
            if int(port) not in [p["port"] for p in svc["spec"]["ports"]]:
                problems.append(f"{pname}: Service {host} has no port {port}")
        limits = c["resources"].get("limits", {})
        want = {"nvidia.com/gpu": str(instance.num_gpus), "vpc.amazonaws.com/efa": str(instance.num_efa)}
        if {k: limits.get(k) for k in want} != want:
            problems.append(f"{pname}: limits {limits}, want {want}")
        node = nodes.get(spec.get("nodeName", ""))
        if node is None or pod["status"].get("phase") != "Running":
            problems.append(f"{pname}: {pod['status'].get('phase')} on {spec.get('nodeName')}")
        elif node["metadata"]["labels"].get("node.kubernetes.io/instance-type") != instance.name:
            problems.append(f"{pname}: placed on {node['metadata']['name']}, not a {instance.name}")
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        shm = volumes.get("shm", {}).get("emptyDir", {})
        if shm.get("medium") != "Memory" or not shm.get("sizeLimit") or mounts.get("shm") != "/dev/shm":
            problems.append(f"{pname}: /dev/shm is not a memory-backed emptyDir with a size limit: {shm}")
        cm = volumes.get("train-config", {}).get("configMap", {}).get("name")
        if cm != f"{name}-config" or mounts.get("train-config") != "/etc/fsdp":
            problems.append(f"{pname}: config map {cm} mounted at {mounts.get('train-config')}")
        elif "train.yaml" not in cluster.get("configmap", ns, name=cm).get("data", {}):
            problems.append(f"{pname}: config map {cm} has no train.yaml")
    return problems


def pods_of(cluster: Cluster, job: dict[str, Any]) -> list[dict[str, Any]]:
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    return cluster.get("pods", ns, selector=f"{JOB_LABEL}={name}")["items"]


def running(pods: list[dict[str, Any]]) -> int:
    return sum(p["status"].get("phase") == "Running" for p in pods)


@pytest.fixture(scope="module")
def gpu_pool(cluster: Cluster) -> Iterator[list[str]]:
    configs = f"overlays/infrastructure/{CLUSTER}/configs"
    docs = dryrun.render(REPO_ROOT, configs)
    dryrun.ensure_namespaces(cluster, {configs: docs})
    cluster.apply(docs)
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    cluster.add_shared_volume(pvc)
    cluster.add_cpu_node()
    cluster.add_gpu_nodes(INSTANCE, 1, advertised=False)
    yield cluster.add_gpu_nodes(INSTANCE, POOL)


def delete_jobs(cluster: Cluster, jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        cluster.kubectl(
            "delete", "pytorchjob", "-n", job["metadata"]["namespace"], job["metadata"]["name"], "--wait=false"
        )
    cluster.wait_for(lambda: not any(pods_of(cluster, j) for j in jobs), 180, "pods of deleted jobs gone")


def test_operator_makes_pods_and_services_that_fit_the_pool(cluster: Cluster, gpu_pool: list[str]) -> None:
    small = {n: dryrun.render(REPO_ROOT, run_dir(n)) for n in (1, 2)}
    for docs in small.values():
        cluster.apply(docs)
    for n, docs in small.items():
        job = job_of(docs)
        cluster.wait_for(lambda job=job, n=n: running(pods_of(cluster, job)) == n, 180, f"{n}-node run running")
        assert job_problems(cluster, job) == []

    big_docs = dryrun.render(REPO_ROOT, run_dir(16))
    big = job_of(big_docs)
    cluster.apply(big_docs)
    free = POOL - 3
    cluster.wait_for(lambda: running(pods_of(cluster, big)) == free, 300, f"{free} pods of the 16-node run running")
    pending = [p for p in pods_of(cluster, big) if p["status"].get("phase") == "Pending"]
    assert len(pending) == 16 - free
    reasons = " ".join(c.get("message", "") for p in pending for c in p["status"].get("conditions", []))
    assert "Insufficient nvidia.com/gpu" in reasons, reasons

    delete_jobs(cluster, [job_of(d) for d in small.values()])
    cluster.wait_for(lambda: running(pods_of(cluster, big)) == 16, 300, "the 16-node run running")
    assert job_problems(cluster, big) == []
    assert sorted(p["spec"]["nodeName"] for p in pods_of(cluster, big)) == sorted(gpu_pool)
    delete_jobs(cluster, [big])


def test_device_plugin_daemonsets_run_on_every_gpu_node_and_nowhere_else(cluster: Cluster, gpu_pool: list[str]) -> None:
    controllers = f"overlays/infrastructure/{CLUSTER}/controllers"
    plugins = [
        d
        for d in dryrun.render(REPO_ROOT, controllers)
        if d["kind"] == "DaemonSet" and d["metadata"]["namespace"] == "device-plugins"
    ]
    assert sorted(d["metadata"]["name"] for d in plugins) == ["efa-device-plugin", "nvidia-device-plugin"]
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "device-plugins"}}, *plugins])
    gpu_nodes = sorted(
        n["metadata"]["name"]
        for n in cluster.get("nodes")["items"]
        if n["metadata"]["labels"].get("node.kubernetes.io/instance-type") == INSTANCE
    )
    assert len(gpu_nodes) == POOL + 1  # the node without advertised GPUs needs the plugins most

    def placed(ds: dict[str, Any]) -> list[str] | None:
        selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
        pods = cluster.get("pods", "device-plugins", selector=selector)["items"]
        nodes = sorted(p["spec"].get("nodeName", "") for p in pods if p["status"].get("phase") == "Running")
        return nodes if len(pods) >= len(gpu_nodes) and len(nodes) == len(pods) else None

    try:
        for d in plugins:
            assert (
                cluster.wait_for(lambda d=d: placed(d), 180, f"{d['metadata']['name']} on every GPU node") == gpu_nodes
            )
    finally:
        cluster.kubectl("delete", "namespace", "device-plugins", "--wait=false")


def test_renamed_rendezvous_host_is_caught(cluster: Cluster, gpu_pool: list[str]) -> None:
    docs = copy.deepcopy(dryrun.render(REPO_ROOT, run_dir(2)))
    job = job_of(docs)
    cmd = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    i = next(i for i, a in enumerate(cmd) if a.startswith("--rdzv-endpoint="))
    cmd[i] = re.sub(r"-worker-0:", "-master-0:", cmd[i])
    cluster.apply(docs)
    try:
        # The operator creates pods and Services at once; whether the pods run does not matter here.
        cluster.wait_for(lambda: len(pods_of(cluster, job)) == 2, 120, "mutated run's pods")
        problems = [p for p in job_problems(cluster, job) if "--rdzv-endpoint" in p]
        assert len(problems) == 2 and all("is not a Service the operator created" in p for p in problems), problems
    finally:
        delete_jobs(cluster, [job])


def test_webhook_rejects_a_job_without_a_pytorch_container(cluster: Cluster, gpu_pool: list[str]) -> None:
    docs = copy.deepcopy(dryrun.render(REPO_ROOT, run_dir(1)))
    job = job_of(docs)
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    res = cluster.kubectl_result("apply", "--server-side", "-f", "-", stdin=dryrun.yaml.safe_dump(job))
    assert res.returncode != 0
    assert 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the request' in res.stderr
    assert "must have at least one container with name pytorch" in res.stderr
    assert cluster.kubectl_result("get", "pytorchjob", "-n", "fsdp", job["metadata"]["name"]).returncode != 0
