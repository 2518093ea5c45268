"""The real-pods level of the cluster harness: real containers beside the API server.

    cluster = levels.start("pods", instance_type="p4de.24xlarge")
    cluster.kubectl("get", "nodes")        # one real node, shaped like the instance type

This module holds what the level's steps (tools/cluster/steps/: namespaces, containerd, coredns,
kubelet, nodes) share and how the level is taken down; configure() sets it up before the first step.
Besides the control plane of the operator level, this level runs a kubelet v1.34.2, containerd
with its runc shim and runc (built with seccomp), the CNI bridge, host-local and loopback plugins, a
trimmed CoreDNS and the Training Operator, all from tools/cluster/build.py. Images come from
tools/cluster/image/ (pause, utility, and the trainer when asked for); nothing is pulled. With
flux=True the Training Operator (and Kueue) are not started: Flux installs them and they run as pods,
from images under their upstream references (tools/cluster/image/).

Everything runs in one private network and mount namespace, held by a `sleep infinity` started with
`unshare`; each component is started into it with `nsenter` (Cluster.start_process). In that mount namespace
/run, /var/lib and /var/log are bind mounts of folders in the cluster's work folder (containerd's shim
sockets, the kubelet's certificate and device-plugin folders, CNI results and the container log links
live at fixed paths no flag moves), and /etc/hosts names the operator's webhook host. The host's own
/run, /var/lib and /var/log are never written.

The network namespace holds a bridge cni0 with the node address 10.88.0.1/16 (pods get 10.88.1.x from
host-local) and 10.0.0.1, the ClusterIP of Service "kubernetes": the API server listens on port 443 on
every address of the namespace and advertises 10.88.0.1, so a pod reaches it at KUBERNETES_SERVICE_HOST
without kube-proxy (there is no iptables binary on these machines). Pods find each other through
CoreDNS (the kubelet's clusterDNS, on 10.88.0.1:53); headless Services, which the Training Operator
creates, need nothing else. Other ClusterIP Services are not routed. The test process reaches the
API server with `nsenter -n kubectl` and health endpoints from a thread that joined the namespace.

The node: labels and taint as cluster.fake_node() derives them for the instance type, the extended
resources nvidia.com/gpu and vpc.amazonaws.com/efa patched into its status (no devices behind them),
and the instance type's vCPUs and memory as its capacity: the kubelet reads the machine's shape from
/proc/meminfo, /sys/devices/system/cpu/online and /sys/devices/system/node, which the mount namespace
overlays with files describing the instance (containers mount their own /proc and /sys and see the
real machine). So the generated requests (most of a node) are admitted by the scheduler and the
kubelet alike, as on the instance.

containerd's root (content store, unpacked snapshots, image metadata) is prepared once per set of
images under $FSDP_GITOPS_CACHE/containerd/<key>/ (a lock serialises the preparation) and each cluster
starts on a hard-linked copy of it, with its own copies of the two metadata databases: layers are never
written in place (overlayfs copies up), so clusters share the unpacked multi-GB trainer image without
importing it again and without sharing a live containerd root.

Traps this machine has (REAL-PODS measurements): root lacks CAP_SYS_RESOURCE, hence containerd's
restrict_oom_score_adj; runc needs the seccomp tag; cgroup v1, so the kubelet's cgroupRoot is created
beforehand in every hierarchy (a name unique per cluster) and removed depth-first at stop.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.cluster import build, image, processes
from tools.cluster.cluster import CPU_INSTANCE, GPU_TAINT, Cluster, fake_node, persistent_volume
from tools.cluster.image import Image
from trainer.catalog import INSTANCE_TYPES

NODE_IP = "10.88.0.1"  # every node's InternalIP: the kubelets share the namespace, each on its own port
SERVICE_IP = "10.0.0.1"  # the first address of the API server's --service-cluster-ip-range: Service "kubernetes"
APISERVER_PORT = 443
COREDNS_READY = "http://127.0.0.1:8181/ready"
# kubelet pkg/kubelet/cm/container_manager_linux.go setupKernelTunables: sysctl -> the value it wants.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
# Fixed host paths the components would write without the private mount namespace (checked after stop).
HOST_PATHS = (
    "/run/containerd",
    "/run/netns",
    "/run/nri",
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/lib/containerd",
    "/var/log/pods",
    "/var/log/containers",
)
HOST_BEFORE = {p: os.path.exists(p) for p in HOST_PATHS}
# What this interpreter created, for the suite's leak check (leftovers()).
CGROUPS: list[str] = []
NETNS: list[int] = []  # inode numbers of the holders' network namespaces
WORKS: list[Path] = []
# The kubelet without QoS cgroups hands containerd no cgroup parent, so every sandbox and container gets
# containerd's default cgroup /k8s.io/<container id> in each hierarchy, outside the level's: the ids the
# level's containerds knew, removed at stop (a killed shim leaves its container's cgroup behind).
CONTAINER_CGROUPS: set[str] = set()
PARENT_BEFORE: dict[Path, bool] = {}  # each hierarchy's /k8s.io before the first level: removed if it was not


def unavailable() -> str:
    """Why this machine cannot run the level ("" when it can): root, namespaces, cgroups, the tools."""
    if os.geteuid() != 0:
        return "the real-pods level needs root (namespaces, mounts, cgroups); this process is not root"
    for tool in ("unshare", "nsenter", "ip", "mount"):
        if not shutil.which(tool):
            return f"the real-pods level needs {tool} on PATH (util-linux, iproute2)"
    if not cgroup_mounts():
        return "the real-pods level needs cgroups mounted under /sys/fs/cgroup"
    res = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"the real-pods level needs network and mount namespaces: unshare failed: {res.stderr.strip()}"
    return ""


def cgroup_mounts() -> list[Path]:
    """Every cgroup (v1) and cgroup2 mount point of this machine."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def cgroup_v1_mounts() -> list[Path]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup":
            found.append(Path(left.split()[4]))
    return found


def ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def pids_in_netns(inodes: set[int]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def kill_until_gone(find: Callable[[], set[int]], timeout_s: float = 20) -> None:
    """SIGKILL what `find` returns until it returns nothing (or the timeout passes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = find()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def cgroup_pids(name: str) -> list[int]:
    pids: set[int] = set()
    for mount in cgroup_mounts():
        root = mount / name
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except OSError:
                    continue
    return sorted(pids)


def rmdir_tree(path: Path) -> None:
    """rmdir a cgroup and its children, deepest first (cgroup folders cannot be removed recursively)."""
    if not path.is_dir():
        return
    dirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, path]:
        try:
            d.rmdir()
        except FileNotFoundError:
            pass


def remove_stale() -> list[str]:
    """Remove what a killed session left (its runner died before stop): the cgroups of clusters whose
    namespace holder is gone, with any process still in them. Returns what was removed."""
    removed = []
    for mount in cgroup_mounts():
        for path in mount.glob("fsdp-realpods-*"):
            work = build.cache_root() / "run" / path.name.removeprefix("fsdp-realpods-")
            try:
                holder = int((work / "pods" / "holder.pid").read_text())
                alive = Path(f"/proc/{holder}").exists()
            except (OSError, ValueError):
                alive = False
            if alive:
                continue
            for procs in path.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for _ in range(50):
                try:
                    rmdir_tree(path)
                    break
                except OSError:
                    time.sleep(0.2)
            removed.append(str(path))
    return removed


# Prepared containerd roots kept (the most recently used): each set of images (every trainer change makes
# one) leaves a root of 2-3 GB in hard links to its predecessor, and a machine that ran many changes
# held seven of them (18 GB); the newest two cover the change under test and the one before it.
PREPARED_ROOTS_KEPT = 2


def prune_prepared_roots(folder: Path, keep: int) -> list[Path]:
    """Removes the prepared containerd roots under `folder` beyond the `keep` most recently used.

    A root is used by hard-linked copies, never in place, so removing it cannot break a running level;
    one that another session is preparing right now (its lock is held) is left alone. Returns the
    folders removed."""
    ready = sorted(folder.glob("*/ready"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for marker in ready[keep:]:
        base = marker.parent
        with open(base / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            marker.unlink(missing_ok=True)  # first, so a half-removed root is never taken as ready
            for child in base.iterdir():
                if child.name != ".lock":
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        removed.append(base)
    return removed


def link_copy(src: Path, dest: Path) -> None:
    """A copy of containerd root `src` at `dest` whose files are hard links (content blobs and unpacked
    layers are never written in place) except the bolt databases, which are written in place."""
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    for db in dest.rglob("*.db"):
        data = db.read_bytes()
        db.unlink()
        db.write_bytes(data)


def leftovers() -> list[str]:
    """What the level left behind after its clusters stopped: processes in their network namespaces,
    cgroups, mounts under their work folders, and files at the host paths the components use."""
    found = []
    for pid in pids_in_netns(set(NETNS)):
        found.append(f"process {pid} still runs in a real-pods network namespace")
    for name in [*CGROUPS, *sorted(CONTAINER_CGROUPS)]:
        for mount in cgroup_mounts():
            if (mount / name).exists():
                found.append(f"cgroup {mount / name} still exists")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if any(point.startswith(str(w)) for w in WORKS):
            found.append(f"mount {point} still mounted")
    for p in HOST_PATHS:
        if os.path.exists(p) and not HOST_BEFORE[p]:
            found.append(f"host path {p} was created")
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == "cni0":
            found.append(f"network link {name} on the host")
    return found


def default_images(trainer: bool = False) -> list[Image]:
    """pause (the sandbox), utility (init containers) and, when asked for, the trainer image."""
    found = [image.pause_image(), image.utility_image()]
    if trainer:
        found.append(image.trainer_image())
    return found


@dataclass(frozen=True)
class Node:
    name: str
    index: int  # kubelet i: port 10250+i, healthz 10248-i... (see RealPods.kubelet)
    instance_type: str  # a GPU instance type of the catalog, or CPU_INSTANCE

    @property
    def gpu(self) -> bool:
        return self.instance_type != CPU_INSTANCE


def configure(
    cluster: Cluster,
    instance_type: str = "p4de.24xlarge",
    gpu_nodes: int = 1,
    cpu_node: bool = False,
    images: list[Image] | None = None,
    trainer: bool = False,
    flux: bool = False,
    **_: Any,
) -> RealPods:
    """What the level's steps share, set on `cluster` before its first step: `gpu_nodes` nodes shaped like
    `instance_type` and, with `cpu_node`, an untainted CPU node; `images`: [pause, utility, ...] (default:
    the image package's, with the trainer's if `trainer`; with `flux` the controllers' too, which Flux
    installs and runs as pods from images under their upstream references); the API server's address
    and flags for a node network (the module docstring). The other options are the levels module's."""
    if images is None:
        images = default_images(trainer)
    if flux:
        images = [*images, *image.controller_images()]
    family = instance_type.replace(".", "-")
    nodes = [Node(f"{family}-{i}", i, instance_type) for i in range(gpu_nodes)]
    if cpu_node:
        nodes.append(Node("cpu-0", len(nodes), CPU_INSTANCE))
    rp = RealPods(cluster, instance_type, images, nodes)
    cluster.level = rp
    cluster.san = f"IP:127.0.0.1,IP:{NODE_IP},IP:{SERVICE_IP},DNS:localhost,DNS:kubernetes.default.svc"
    cluster.apiserver_port = APISERVER_PORT
    cluster.advertise_address = NODE_IP
    # The API server dials a node at its InternalIP (the node's name resolves nowhere here).
    cluster.apiserver_flags = ["--kubelet-preferred-address-types=InternalIP"]
    if flux:
        # Webhooks, CRD conversion and APIServices by Service: the API server dials the Service's
        # endpoint (the pod's IP on the bridge) instead of its ClusterIP, which nothing routes here.
        cluster.apiserver_flags.append("--enable-aggregator-routing=true")
    # The operator's default init-container image (alpine) cannot be pulled here; the utility image has
    # the same `nslookup` and `sh` (dash) its wait-for-master script needs.
    cluster.operator_flags = [f"--pytorch-init-container-image={images[1].name}"]
    cluster.before_stop.append(rp.stop_pods)
    cluster.after_stop.append(rp.cleanup)
    return rp


def node_shape(node: Node) -> tuple[dict[str, str], list[dict[str, str]], dict[str, str]]:
    """Labels, taints and extended resources of the node's instance type, as the kwok nodes of
    Cluster.add_gpu_nodes and add_cpu_node have them."""
    extended: dict[str, str] = {}
    if node.gpu:
        it = INSTANCE_TYPES[node.instance_type]
        extended = {"nvidia.com/gpu": str(it.num_gpus), "vpc.amazonaws.com/efa": str(it.num_efa)}
    labels = {"node.kubernetes.io/instance-type": node.instance_type}
    fake = fake_node(node.name, labels, extended, taints=[GPU_TAINT] if node.gpu else [])
    labels = {k: v for k, v in fake["metadata"]["labels"].items() if k != "type"}  # "type: kwok" is kwok's
    return labels, fake["spec"]["taints"], extended


def ctr(sock: Path, *args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """`ctr -n k8s.io ARGS` against the containerd at `sock`."""
    cmd = [str(build.binary("ctr")), f"--address={sock}", "-n", "k8s.io", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


@dataclass
class RealPods:
    cluster: Cluster
    instance_type: str
    images: list[Image]
    nodes: list[Node]
    netns: int = 0
    dir: Path = field(init=False)
    socks: dict[str, Path] = field(default_factory=dict)  # node -> its containerd's socket
    cgroup: str = field(init=False)

    def __post_init__(self) -> None:
        self.dir = self.cluster.work / "pods"
        self.cgroup = f"fsdp-realpods-{self.cluster.work.name}"  # machine-wide: unique per cluster

    # ----------------------------------------------------------------------------------- namespaces

    # -------------------------------------------------------------------------------- shared volume

    def shared_volume(self, pvc: dict[str, Any]) -> Path:
        """A PersistentVolume bound to `pvc` standing in for FSx: a folder of the work folder (hostPath on
        the one node), with the claim's access modes, its root owned by root with mode 0755 the way a new
        FSx file system comes up. Returns the folder."""
        meta = pvc["metadata"]
        path = self.dir / "volumes" / f"{meta['namespace']}-{meta['name']}"
        path.mkdir(parents=True)
        os.chown(path, 0, 0)
        path.chmod(0o755)
        self.cluster.apply(
            [persistent_volume(pvc, {"path": str(path), "type": "Directory"}, persistentVolumeReclaimPolicy="Retain")]
        )
        return path

    # ------------------------------------------------------------------------------------------ stop

    def stop_pods(self) -> None:
        """Before the components stop: the kubelet (so nothing restarts), then every container process
        (in the cgroupRoot) and every shim (in the holder's network namespace)."""
        for node in self.nodes:
            kubelet = self.cluster.procs.pop(f"kubelet-{node.name}", None)
            if kubelet:
                processes.stop(kubelet)
        own = {p.pid for p in self.cluster.procs.values()}
        CONTAINER_CGROUPS.update(f"k8s.io/{cid}" for cid in self.ctr_lines("containers", "ls", "-q"))
        kill_until_gone(
            lambda: (
                set(cgroup_pids(self.cgroup))
                | self.task_pids()
                | ({p for p in pids_in_netns({self.netns}) if p not in own} if self.netns else set())
            )
        )
        # Nothing of the cluster outlives it (its work folder is removed): no graceful stops to wait for
        # (kube-apiserver alone would take its 10 s). The holder goes last, in Cluster.stop.
        for proc in list(self.cluster.procs.values()):
            if proc.name != "namespaces":
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def task_pids(self) -> set[int]:
        """The first process of every container the nodes' containerds run: a container can end up in a
        cgroup outside the level's (containerd's default /k8s.io/<id>) and in a network namespace of its
        pod, where the other two sweeps do not look. Its pid namespace ends with that process."""
        pids: set[int] = set()
        for line in self.ctr_lines("tasks", "ls"):
            fields = line.split()  # TASK PID STATUS (and the heading)
            if len(fields) >= 3 and fields[1].isdigit() and fields[2] == "RUNNING":
                pids.add(int(fields[1]))
        return pids

    def ctr_lines(self, *args: str) -> list[str]:
        """What `ctr -n k8s.io ARGS` prints for every node's containerd, line by line."""
        lines: list[str] = []
        for sock in self.socks.values():
            try:
                res = ctr(sock, *args, timeout_s=20)
            except subprocess.TimeoutExpired:
                continue
            lines += [line for line in res.stdout.splitlines() if line.strip()]
        return lines

    def cleanup(self) -> None:
        """After every component stopped: what is still in the namespace, then the cgroups."""
        if self.netns:
            kill_until_gone(lambda: set(pids_in_netns({self.netns})))
            # Empty, the namespace is gone, and the kernel may give its inode number to a namespace of
            # another level (another test worker's): leftovers() stops looking at it.
            if self.netns in NETNS and not pids_in_netns({self.netns}):
                NETNS.remove(self.netns)
        kill_until_gone(lambda: {pid for name in CONTAINER_CGROUPS for pid in cgroup_pids(name)})
        for mount in cgroup_mounts():
            for name in [self.cgroup, *sorted(CONTAINER_CGROUPS)]:
                for _ in range(50):
                    try:
                        rmdir_tree(mount / name)
                        break
                    except OSError:  # EBUSY while the last killed processes leave
                        time.sleep(0.2)
            if PARENT_BEFORE.get(mount) is False:
                try:
                    (mount / "k8s.io").rmdir()  # only once empty: another level may still use it
                except OSError:
                    pass
        CONTAINER_CGROUPS.difference_update(
            {n for n in CONTAINER_CGROUPS if not any((m / n).exists() for m in cgroup_mounts())}
        )
