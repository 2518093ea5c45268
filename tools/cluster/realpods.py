"""The real-pods level of the cluster harness: real containers beside the API server.

    cluster = Cluster.start(level="pods", instance_type="p4de.24xlarge")
    cluster.kubectl("get", "nodes")        # one real node, "realnode", shaped like the instance type

Besides the control plane of tools/cluster/harness.py, this level runs a kubelet v1.34.2, containerd
with its runc shim and runc (built with seccomp), the CNI bridge, host-local and loopback plugins, a
trimmed CoreDNS and the Training Operator, all from tools/cluster/build.py. Images come from
tools/cluster/image.py (pause, utility, and the trainer when asked for); nothing is pulled. With
flux=True the Training Operator (and Kueue) are not started: Flux installs them and they run as pods,
from images under their upstream references (tools/cluster/controller_images.py).

Everything runs in one private network and mount namespace, held by a `sleep infinity` started with
`unshare`; each component is started into it with `nsenter` (Cluster._start). In that mount namespace
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

The node: labels and taint as harness.fake_node() derives them for the instance type, the extended
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

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tools.cluster import build, processes
from tools.cluster.processes import StartError

if TYPE_CHECKING:
    from tools.cluster.harness import Cluster
    from tools.cluster.image import Image

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
CPU_INSTANCE = "m6i.4xlarge"  # the label of the CPU node (the controllers' and staging pods' node group)
CLONE_NEWNET = 0x40000000
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
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
_HOST_BEFORE = {p: os.path.exists(p) for p in HOST_PATHS}
# What this interpreter created, for the suite's leak check (leftovers()).
CGROUPS: list[str] = []
NETNS: list[int] = []  # inode numbers of the holders' network namespaces
WORKS: list[Path] = []
# The kubelet without QoS cgroups hands containerd no cgroup parent, so every sandbox and container gets
# containerd's default cgroup /k8s.io/<container id> in each hierarchy, outside the level's: the ids the
# level's containerds knew, removed at stop (a killed shim leaves its container's cgroup behind).
CONTAINER_CGROUPS: set[str] = set()
_PARENT_BEFORE: dict[Path, bool] = {}  # each hierarchy's /k8s.io before the first level: removed if it was not


def unavailable() -> str:
    """Why this machine cannot run the level ("" when it can): root, namespaces, cgroups, the tools."""
    if os.geteuid() != 0:
        return "the real-pods level needs root (namespaces, mounts, cgroups); this process is not root"
    for tool in ("unshare", "nsenter", "ip", "mount"):
        if not shutil.which(tool):
            return f"the real-pods level needs {tool} on PATH (util-linux, iproute2)"
    if not _cgroup_mounts():
        return "the real-pods level needs cgroups mounted under /sys/fs/cgroup"
    res = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"the real-pods level needs network and mount namespaces: unshare failed: {res.stderr.strip()}"
    return ""


def in_netns(holder: int, fn: Callable[[], Any]) -> Any:
    """Run fn() on a new thread that joined `holder`'s network namespace (sockets it opens live there)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            fd = os.open(f"/proc/{holder}/ns/net", os.O_RDONLY)
            try:
                if ctypes.CDLL("libc.so.6", use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the cluster's network namespace failed")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _cgroup_mounts() -> list[Path]:
    """Every cgroup (v1) and cgroup2 mount point of this machine."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def _cgroup_v1_mounts() -> list[Path]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup":
            found.append(Path(left.split()[4]))
    return found


def _ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def _pids_in_netns(inodes: set[int]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _kill_until_gone(find: Callable[[], set[int]], timeout_s: float = 20) -> None:
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


def _cgroup_pids(name: str) -> list[int]:
    pids: set[int] = set()
    for mount in _cgroup_mounts():
        root = mount / name
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except OSError:
                    continue
    return sorted(pids)


def _rmdir_tree(path: Path) -> None:
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
    for mount in _cgroup_mounts():
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
                    _rmdir_tree(path)
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


def _link_copy(src: Path, dest: Path) -> None:
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
    for pid in _pids_in_netns(set(NETNS)):
        found.append(f"process {pid} still runs in a real-pods network namespace")
    for name in [*CGROUPS, *sorted(CONTAINER_CGROUPS)]:
        for mount in _cgroup_mounts():
            if (mount / name).exists():
                found.append(f"cgroup {mount / name} still exists")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if any(point.startswith(str(w)) for w in WORKS):
            found.append(f"mount {point} still mounted")
    for p in HOST_PATHS:
        if os.path.exists(p) and not _HOST_BEFORE[p]:
            found.append(f"host path {p} was created")
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == "cni0":
            found.append(f"network link {name} on the host")
    return found


def default_images(trainer: bool = False) -> list[Image]:
    """pause (the sandbox), utility (init containers) and, when asked for, the trainer image."""
    from tools.cluster import image

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


def steps(
    cluster: Cluster,
    api: list[tuple[str, Callable[[], None]]],
    control: list[tuple[str, Callable[[], None]]],
    instance_type: str = "p4de.24xlarge",
    gpu_nodes: int = 1,
    cpu_node: bool = False,
    images: list[Image] | None = None,
    trainer: bool = False,
    kueue: bool = False,
    flux: bool = False,
    trainjob: bool = False,
) -> list[tuple[str, Callable[[], None]]]:
    """The level's bring-up: the harness's control plane, started inside the namespaces, then the nodes:
    `gpu_nodes` shaped like `instance_type` and, with `cpu_node`, an untainted CPU node.
    `trainjob`: the JobSet controller and the Kubeflow Trainer controller manager too
    (tools/cluster/kubeflow_trainer.py: their webhook host names go into the hosts file bound at /etc/hosts).
    `images`: [pause, utility, ...] (default: tools/cluster/image.py's, with the trainer's if `trainer`)."""
    if images is None:
        images = default_images(trainer)
    if flux:
        # The Training Operator and Kueue run as the pods Flux installs, from images under the upstream
        # references (tools/cluster/controller_images.py), instead of as host processes.
        if kueue:
            raise ValueError("flux=True installs Kueue through Flux; leave kueue out")
        from tools.cluster.controller_images import controller_images

        images = [*images, *controller_images()]
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
    pki, hosts, *rest = api
    found = [
        pki,
        hosts,
        ("namespaces", rp.namespaces),
        *rest,
        *control,
        ("containerd", rp.containerd),
        ("coredns", rp.coredns),
        ("kubelet", rp.kubelets),
        ("nodes", rp.ready_nodes),
        *([] if flux else [("training-operator", cluster._training_operator)]),
    ]
    if kueue:
        from tools.cluster import kueue as kueue_level

        def start_kueue() -> None:
            kueue_level.start(cluster)

        found.append(("kueue", start_kueue))
    if trainjob:
        from tools.cluster import kubeflow_trainer

        def start_trainer() -> None:
            kubeflow_trainer.start(cluster)

        found.append(("kubeflow-trainer", start_trainer))
    return found


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

    def _machine_files(self) -> Path:
        """/proc/meminfo, /sys/devices/system/cpu/online and /sys/devices/system/node as the instance
        type has them (one NUMA node, one thread per core), for the kubelet's view of the machine."""
        from trainer.catalog import INSTANCE_TYPES

        it = INSTANCE_TYPES[self.instance_type]
        out = self.dir / "machine"
        kib = it.host_memory_gib * 1024 * 1024
        lines = []
        for line in Path("/proc/meminfo").read_text().splitlines():
            key = line.split(":", 1)[0]
            lines.append(f"MemTotal:       {kib} kB" if key == "MemTotal" else line)
        (out / "node" / "node0" / "hugepages").mkdir(parents=True)
        (out / "meminfo").write_text("\n".join(lines) + "\n")
        (out / "online").write_text(f"0-{it.num_vcpus - 1}\n")
        node0 = out / "node" / "node0"
        (node0 / "meminfo").write_text(f"Node 0 MemTotal:       {kib} kB\nNode 0 MemFree:        {kib} kB\n")
        (node0 / "distance").write_text("10\n")
        (node0 / "cpulist").write_text(f"0-{it.num_vcpus - 1}\n")
        for cpu in range(it.num_vcpus):
            topo = node0 / f"cpu{cpu}" / "topology"
            topo.mkdir(parents=True)
            (topo / "core_id").write_text(f"{cpu}\n")
            (topo / "physical_package_id").write_text("0\n")
        # The kubelet sets these machine-wide sysctls to its defaults at start (protectKernelDefaults off)
        # and refuses to start where they differ (on): here it finds its values and the host's stay.
        for name, value in KUBELET_SYSCTLS.items():
            (out / "sysctl" / name).parent.mkdir(parents=True, exist_ok=True)
            (out / "sysctl" / name).write_text(f"{value}\n")
        return out

    def namespaces(self) -> None:
        """The holder: private network and mount namespaces with the bind mounts, the bridge and the
        machine's shape; every later component is started inside (Cluster._start)."""
        for sub in ("run", "varlib", "varlog", "cni-conf", "cni-ipam", "pod-logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        machine = self._machine_files()
        (self.dir / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
        ready = self.dir / "namespaces-ready"
        script = [
            "set -e",
            f"mount --bind {self.dir / 'run'} /run",
            f"mount --bind {self.dir / 'varlib'} /var/lib",
            f"mount --bind {self.dir / 'varlog'} /var/log",
            f"mount --bind {self.cluster.work / 'hosts'} /etc/hosts",
            f"mount --bind {machine / 'meminfo'} /proc/meminfo",
            f"mount --bind {machine / 'online'} /sys/devices/system/cpu/online",
            f"mount --bind {machine / 'node'} /sys/devices/system/node",
            *(f"mount --bind {machine / 'sysctl' / name} /proc/sys/{name}" for name in KUBELET_SYSCTLS),
            "ip link set lo up",
            "ip link add cni0 type bridge",
            f"ip addr add {NODE_IP}/16 dev cni0",
            f"ip addr add {SERVICE_IP}/32 dev cni0",
            "ip link set cni0 up",
            "echo 1 > /proc/sys/net/ipv4/ip_forward",
            f"touch {ready}",
            "exec sleep infinity",
        ]
        args = ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]
        proc = processes.start("namespaces", args, self.cluster.work / "logs" / "namespaces.log")
        self.cluster.procs["namespaces"] = proc
        WORKS.append(self.cluster.work)
        proc.wait_ready(ready.exists, 30, "holding the namespaces")
        (self.dir / "holder.pid").write_text(str(proc.pid))
        remove_stale()
        self.netns = _ns_inode(proc.pid, "net")
        NETNS.append(self.netns)
        self.cluster.holder = proc.pid
        for mount in _cgroup_mounts():
            _PARENT_BEFORE.setdefault(mount, (mount / "k8s.io").exists())
        for mount in _cgroup_v1_mounts():
            # The kubelet's cgroupRoot must exist in every hierarchy; cpuset needs its cpus and mems.
            if self.cgroup not in CGROUPS:
                CGROUPS.append(self.cgroup)
            for path in [mount / self.cgroup, *(mount / self.cgroup / n.name for n in self.nodes)]:
                path.mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (mount / f).exists():
                        (path / f).write_text((mount / f).read_text())

    # ----------------------------------------------------------------------------------- containerd

    def _containerd_config(self, root: Path, state: Path, sock: Path) -> Path:
        pause = self.images[0].name
        cni_dir = build.binary("cni-bridge").parent
        for name in ("cni-host-local", "cni-loopback"):
            build.binary(name)
        config = f"""version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
                    "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
                    "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # This machine's root lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj to -998.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{build.binary("runc")}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_dir}"]
    conf_dir = "{self.dir / "cni-conf"}"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        path = state.parent / f"{state.name}.toml"
        path.write_text(config)
        return path

    def _run_containerd(self, name: str, root: Path, state: Path) -> tuple[processes.Process, Path]:
        state.mkdir(parents=True, exist_ok=True)
        sock = state.parent / f"{state.name}.sock"
        config = self._containerd_config(root, state, sock)
        binary = build.binary("containerd")
        build.binary("containerd-shim-runc-v2")
        env = {**os.environ, "PATH": f"{binary.parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
        proc = self.cluster._start(name, [str(binary), f"--config={config}"], env=env)
        proc.wait_ready(lambda: self._ctr(sock, "version").returncode == 0, 60, "answering")
        return proc, sock

    def _ctr(self, sock: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(build.binary("ctr")), f"--address={sock}", "-n", "k8s.io", *args], capture_output=True, text=True
        )

    def _prepared_root(self) -> Path:
        """containerd's root with every image imported and unpacked, prepared once per set of images."""
        key = hashlib.sha256(json.dumps([[i.name, i.digest] for i in self.images]).encode()).hexdigest()[:16]
        base = build.cache_root() / "containerd" / key
        root = base / "root"
        if (base / "ready").exists():
            (base / "ready").touch()  # its mtime is when it was last used: prune_prepared_roots keeps the newest
            return root
        base.mkdir(parents=True, exist_ok=True)
        with open(base / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be preparing the same root
            if (base / "ready").exists():
                return root
            tmp = base / f"root.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
            # Start from the newest root prepared before (a trainer change adds one small layer): the
            # import then writes only the blobs and snapshots that root lacks.
            earlier = sorted(base.parent.glob("*/ready"), key=lambda p: p.stat().st_mtime)
            if earlier:
                _link_copy(earlier[-1].parent / "root", tmp)
            proc, sock = self._run_containerd("containerd-prepare", tmp, self.dir / "containerd-prepare")
            try:
                for img in self.images:
                    res = self._ctr(sock, "images", "import", "--snapshotter=overlayfs", str(img.archive))
                    if res.returncode != 0:
                        raise StartError(f"ctr images import {img.archive} failed: {res.stderr.strip()}")
            finally:
                processes.stop(proc)
                self.cluster.procs.pop("containerd-prepare", None)
            os.replace(tmp, root)
            (base / "ready").touch()
        prune_prepared_roots(base.parent, keep=PREPARED_ROOTS_KEPT)
        return root

    def containerd(self) -> None:
        """One containerd per node, each on a hard-linked copy of the prepared root (module docstring)."""
        prepared = self._prepared_root()
        (self.dir / "cni-conf" / "10-realpods.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "realpods",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": str(self.dir / "cni-ipam"),
                                "ranges": [[{"subnet": "10.88.0.0/16", "rangeStart": "10.88.1.0", "gateway": NODE_IP}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        }
                    ],
                }
            )
        )
        for node in self.nodes:
            root = self.dir / f"containerd-{node.name}-root"
            _link_copy(prepared, root)
            _, sock = self._run_containerd(f"containerd-{node.name}", root, self.dir / f"containerd-{node.name}")
            listed = self._ctr(sock, "images", "ls", "-q").stdout.split()
            missing = [i.name for i in self.images if i.name not in listed]
            if missing:
                raise StartError(f"containerd's prepared root lacks {missing} (under {prepared}); remove it to rebuild")
            self.socks[node.name] = sock

    # ------------------------------------------------------------------------------------- CoreDNS

    def coredns(self) -> None:
        corefile = self.dir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    cache 1
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""
        )
        proc = self.cluster._start("coredns", [str(build.binary("coredns")), f"-conf={corefile}"])
        proc.wait_ready(lambda: self.cluster.get_url(COREDNS_READY) == "OK", 60, "ready")

    # ------------------------------------------------------------------------------------- kubelet

    @staticmethod
    def node_shape(node: Node) -> tuple[dict[str, str], list[dict[str, str]], dict[str, str]]:
        """Labels, taints and extended resources of the node's instance type, as the kwok nodes of
        Cluster.add_gpu_nodes and add_cpu_node have them."""
        from tools.cluster.harness import fake_node
        from trainer.catalog import INSTANCE_TYPES

        extended: dict[str, str] = {}
        if node.gpu:
            it = INSTANCE_TYPES[node.instance_type]
            extended = {"nvidia.com/gpu": str(it.num_gpus), "vpc.amazonaws.com/efa": str(it.num_efa)}
        fake = fake_node(
            node.name,
            {"node.kubernetes.io/instance-type": node.instance_type},
            extended,
            taints=[GPU_TAINT] if node.gpu else [],
        )
        labels = {k: v for k, v in fake["metadata"]["labels"].items() if k != "type"}  # "type: kwok" is kwok's
        return labels, fake["spec"]["taints"], extended

    def kubelets(self) -> None:
        for node in self.nodes:
            self._kubelet(node)

    def _kubelet(self, node: Node) -> None:
        labels, taints, _ = self.node_shape(node)
        folder = self.dir / f"kubelet-{node.name}"
        folder.mkdir()
        healthz = 10248 - node.index
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": 10250 + node.index,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            # Reachable only inside the namespace: the API server (logs, exec) is its only client.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup}/{node.name}",
            # No QoS cgroups: the kubelet would write the node's (the instance's) CPU list into
            # kubepods' cpuset, which this machine's few CPUs refuse; pods' cgroups go under cgroupRoot.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socks[node.name]}",
            "clusterDNS": [NODE_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": str(self.dir / "resolv.conf"),
            "podLogsDir": str(folder / "pod-logs"),
            "serializeImagePulls": False,
            # The imported images cannot be pulled again: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            # A node is Ready at the first status update after the runtime reports its network ready:
            # every second (the status is sent only when it changes, or at the report frequency).
            "nodeStatusUpdateFrequency": "1s",
            "nodeStatusReportFrequency": "1m",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "runtimeRequestTimeout": "2m",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "protectKernelDefaults": False,
        }
        path = folder / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = self.cluster._start(
            f"kubelet-{node.name}",
            [
                str(build.binary("kubelet")),
                f"--config={path}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--root-dir={folder / 'root'}",
                f"--cert-dir={folder / 'pki'}",
                f"--hostname-override={node.name}",
                f"--node-ip={NODE_IP}",
                "--node-labels="
                + ",".join(f"{k}={v}" for k, v in labels.items() if not k.startswith("kubernetes.io/")),
                *(
                    ["--register-with-taints=" + ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in taints)]
                    if taints
                    else []
                ),
                "--v=2",
            ],
        )
        url = f"http://127.0.0.1:{healthz}/healthz"
        proc.wait_ready(lambda: self.cluster.get_url(url) == "ok", 60, "healthy")

    def ready_nodes(self) -> None:
        """Wait for every node to be Ready, then advertise the GPU nodes' extended resources (what the
        device plugins would register; no devices behind them)."""
        cluster = self.cluster
        cluster.wait_for(self._nodes_ready, 60, f"nodes {[n.name for n in self.nodes]} Ready")
        for node in self.nodes:
            _, _, extended = self.node_shape(node)
            if not extended:
                continue
            patch = [
                {"op": "add", "path": f"/status/capacity/{k.replace('/', '~1')}", "value": v}
                for k, v in extended.items()
            ]
            cluster.kubectl("patch", "node", node.name, "--subresource=status", "--type=json", "-p", json.dumps(patch))

        def advertised() -> bool:
            for node in self.nodes:
                alloc = cluster.get("node", name=node.name)["status"].get("allocatable", {})
                if any(alloc.get(k) != v for k, v in self.node_shape(node)[2].items()):
                    return False
            return True

        cluster.wait_for(advertised, 60, "the GPU nodes advertising nvidia.com/gpu and vpc.amazonaws.com/efa")

    def _nodes_ready(self) -> bool:
        res = self.cluster.kubectl_result("get", "nodes", "-o", "json")
        if res.returncode != 0:
            return False
        ready = {
            n["metadata"]["name"]
            for n in json.loads(res.stdout)["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
        }
        return ready >= {n.name for n in self.nodes}

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
        from tools.cluster.harness import persistent_volume  # harness imports this module

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
        CONTAINER_CGROUPS.update(f"k8s.io/{cid}" for cid in self._ctr_lines("containers", "ls", "-q"))
        _kill_until_gone(
            lambda: (
                set(_cgroup_pids(self.cgroup))
                | self._task_pids()
                | ({p for p in _pids_in_netns({self.netns}) if p not in own} if self.netns else set())
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

    def _task_pids(self) -> set[int]:
        """The first process of every container the nodes' containerds run: a container can end up in a
        cgroup outside the level's (containerd's default /k8s.io/<id>) and in a network namespace of its
        pod, where the other two sweeps do not look. Its pid namespace ends with that process."""
        pids: set[int] = set()
        for line in self._ctr_lines("tasks", "ls"):
            fields = line.split()  # TASK PID STATUS (and the heading)
            if len(fields) >= 3 and fields[1].isdigit() and fields[2] == "RUNNING":
                pids.add(int(fields[1]))
        return pids

    def _ctr_lines(self, *args: str) -> list[str]:
        """What `ctr -n k8s.io ARGS` prints for every node's containerd, line by line."""
        lines: list[str] = []
        for sock in self.socks.values():
            try:
                res = subprocess.run(
                    [str(build.binary("ctr")), f"--address={sock}", "-n", "k8s.io", *args],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
            except subprocess.TimeoutExpired:
                continue
            lines += [line for line in res.stdout.splitlines() if line.strip()]
        return lines

    def cleanup(self) -> None:
        """After every component stopped: what is still in the namespace, then the cgroups."""
        if self.netns:
            _kill_until_gone(lambda: set(_pids_in_netns({self.netns})))
            # Empty, the namespace is gone, and the kernel may give its inode number to a namespace of
            # another level (another test worker's): leftovers() stops looking at it.
            if self.netns in NETNS and not _pids_in_netns({self.netns}):
                NETNS.remove(self.netns)
        _kill_until_gone(lambda: {pid for name in CONTAINER_CGROUPS for pid in _cgroup_pids(name)})
        for mount in _cgroup_mounts():
            for name in [self.cgroup, *sorted(CONTAINER_CGROUPS)]:
                for _ in range(50):
                    try:
                        _rmdir_tree(mount / name)
                        break
                    except OSError:  # EBUSY while the last killed processes leave
                        time.sleep(0.2)
            if _PARENT_BEFORE.get(mount) is False:
                try:
                    (mount / "k8s.io").rmdir()  # only once empty: another level may still use it
                except OSError:
                    pass
        CONTAINER_CGROUPS.difference_update(
            {n for n in CONTAINER_CGROUPS if not any((m / n).exists() for m in _cgroup_mounts())}
        )
