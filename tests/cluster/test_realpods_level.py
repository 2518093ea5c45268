"""The real-pods level (tools/cluster/realpods.py): a real kubelet runs real containers beside the API
server, on a node shaped like a GPU instance type, inside private namespaces.

One level, shared with test_realpods_runs.py (tests/cluster/conftest.py `pods`): two p4de-shaped
nodes with their GPU taint and an untainted CPU node. The containers here use the utility image
(busybox applets, dash, Python).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from realpods_support import INSTANCE, SHARED_LEVEL

from tools.cluster import realpods
from tools.cluster.cluster import Cluster
from trainer.catalog import INSTANCE_TYPES

pytestmark = [pytest.mark.realpods, pytest.mark.cluster, pytest.mark.slow]

REALPODS_OPTIONS = SHARED_LEVEL  # one started level with test_realpods_runs.py
GPU_NODE = "p4de-24xlarge-0"
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def utility(cluster: Cluster) -> str:
    return cluster.level.images[1].name


def pod(name: str, image: str, script: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": TOLERATE_GPU,
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script]}
            ],
            **spec,
        },
    }


def finished(cluster: Cluster, name: str, timeout_s: float = 120) -> dict[str, Any]:
    def phase() -> dict[str, Any] | None:
        p = cluster.get("pod", "default", name=name)
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

    return cluster.wait_for(phase, timeout_s, f"pod {name} finished")


def logs(cluster: Cluster, name: str) -> str:
    return cluster.kubectl("logs", "-n", "default", name)


def test_the_node_is_shaped_like_the_instance_type(pods: Cluster) -> None:
    it = INSTANCE_TYPES[INSTANCE]
    node = pods.get("node", name=GPU_NODE)
    labels, status = node["metadata"]["labels"], node["status"]
    assert labels["node.kubernetes.io/instance-type"] == INSTANCE
    assert node["spec"]["taints"] == [realpods.GPU_TAINT]
    assert status["capacity"]["cpu"] == str(it.num_vcpus)
    assert status["capacity"]["memory"] in (f"{it.host_memory_gib}Gi", f"{it.host_memory_gib * 1024 * 1024}Ki")
    assert status["allocatable"]["nvidia.com/gpu"] == str(it.num_gpus)
    assert status["allocatable"]["vpc.amazonaws.com/efa"] == str(it.num_efa)
    ready = {c["type"]: c["status"] for c in status["conditions"]}
    assert ready["Ready"] == "True"
    assert set(pods.timings) >= {"namespaces", "containerd", "kubelet", "nodes", "training-operator"}
    cpu = pods.get("node", name="cpu-0")
    assert cpu["metadata"]["labels"]["node.kubernetes.io/instance-type"] == realpods.CPU_INSTANCE
    assert not cpu["spec"].get("taints") and "nvidia.com/gpu" not in cpu["status"]["allocatable"]


def test_a_gpu_shaped_pod_runs_as_its_user_and_sees_the_real_machine(pods: Cluster) -> None:
    spec = pod(
        "shape",
        utility(pods),
        "id -u; id -g; grep -c ^processor /proc/cpuinfo; grep MemTotal /proc/meminfo",
        securityContext={"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": True},
    )
    spec["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "10", "memory": "122Gi", "nvidia.com/gpu": 1, "vpc.amazonaws.com/efa": 1},
        "limits": {"nvidia.com/gpu": 1, "vpc.amazonaws.com/efa": 1},
    }
    pods.apply([spec])
    done = finished(pods, "shape")
    out = logs(pods, "shape").split("\n")
    assert done["status"]["phase"] == "Succeeded", out
    assert out[:2] == ["10001", "10001"]
    # The node advertises the instance; the container runs on this machine's few cores.
    assert int(out[2]) < INSTANCE_TYPES[INSTANCE].num_vcpus


def test_the_gpu_taint_keeps_untolerating_pods_on_the_cpu_node(pods: Cluster) -> None:
    spec = pod("untolerated", utility(pods), "true")
    del spec["spec"]["tolerations"]
    pods.apply([spec])
    assert finished(pods, "untolerated")["spec"]["nodeName"] == "cpu-0"


def test_pods_reach_the_api_server_at_the_kubernetes_service_address(pods: Cluster) -> None:
    script = (
        'python3 -c "import os, socket; '
        "s = socket.create_connection((os.environ['KUBERNETES_SERVICE_HOST'], "
        "int(os.environ['KUBERNETES_SERVICE_PORT'])), 5); print('connected', s.getpeername()[0])\""
    )
    pods.apply([pod("api", utility(pods), script)])
    done = finished(pods, "api")
    assert done["status"]["phase"] == "Succeeded", logs(pods, "api")
    assert logs(pods, "api").strip() == f"connected {realpods.SERVICE_IP}"


def test_a_pytorchjob_rendezvous_by_the_operators_service_names(pods: Cluster) -> None:
    """Worker 1 waits in the operator's init container until worker 0's name resolves (CoreDNS), then
    both meet over TCP at MASTER_ADDR:MASTER_PORT, which the operator sets to worker 0's Service."""
    program = (
        "import os, socket, time\n"
        "rank, addr, port = int(os.environ['RANK']), os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])\n"
        "if rank == 0:\n"
        "    srv = socket.create_server(('', port)); conn, _ = srv.accept(); print('got', conn.recv(64).decode())\n"
        "else:\n"
        "    for _ in range(120):\n"
        "        try:\n"
        "            s = socket.create_connection((addr, port), 2); break\n"
        "        except OSError:\n"
        "            time.sleep(0.5)\n"
        "    s.sendall(b'hello from ' + os.environ['HOSTNAME'].encode()); print('sent to', addr)\n"
    )
    container = {
        "name": "pytorch",
        "image": utility(pods),
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", program],
        "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
    }
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "meet", "namespace": "default"},
        "spec": {
            "pytorchReplicaSpecs": {
                role: {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {"spec": {"tolerations": TOLERATE_GPU, "containers": [container]}},
                }
                for role in ("Master", "Worker")
            }
        },
    }
    started = time.monotonic()
    pods.apply([job])

    def state() -> str:
        conds = pods.get("pytorchjob", "default", name="meet").get("status", {}).get("conditions", [])
        return next(
            (c["type"] for c in reversed(conds) if c["status"] == "True" and c["type"] in ("Succeeded", "Failed")), ""
        )

    assert pods.wait_for(state, 180, "PyTorchJob meet finished") == "Succeeded"
    elapsed = time.monotonic() - started
    master = logs(pods, "meet-master-0")
    worker = json.loads(pods.kubectl("get", "pod", "-n", "default", "meet-worker-0", "-o", "json"))
    assert master.strip() == "got hello from meet-worker-0", master
    assert [c["name"] for c in worker["spec"]["initContainers"]] == ["init-pytorch"]
    assert worker["spec"]["initContainers"][0]["image"] == utility(pods)
    print(f"PyTorchJob 1 master + 1 worker: {elapsed:.1f} s")


def test_a_pod_still_running_at_the_stop_leaves_no_cgroup(pods: Cluster) -> None:
    """Without QoS cgroups the kubelet hands containerd no cgroup parent: the sandbox and the container
    get containerd's default cgroup /k8s.io/<id> in every hierarchy, outside the level's own. This pod
    is still running when the level stops; the suite's last check (tests/cluster/conftest.py) fails if
    either cgroup is left, so the stop must kill and remove what it did not create itself."""
    spec = pod("left-running", utility(pods), "sleep 3600")
    pods.apply([spec])

    def running() -> dict[str, Any] | None:
        p = pods.get("pod", "default", name="left-running")
        statuses = p["status"].get("containerStatuses", [])
        return p if statuses and statuses[0].get("state", {}).get("running") else None

    p = pods.wait_for(running, 120, "pod left-running runs")
    cid = p["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    where = [m for m in realpods.cgroup_mounts() if (m / "k8s.io" / cid).is_dir()]
    assert where, f"container {cid} has no cgroup under /k8s.io in any hierarchy"
    realpods.CONTAINER_CGROUPS.add(f"k8s.io/{cid}")  # what the suite's last check expects gone
