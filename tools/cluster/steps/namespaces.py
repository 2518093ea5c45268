"""Step `namespaces` (the real-pods level): the holder, a `sleep infinity` in private network and mount
namespaces with the bind mounts, the bridge and the machine's shape; every later component is started
inside it (Cluster.start_process enters it with nsenter). See tools/cluster/realpods.py."""

from __future__ import annotations

from pathlib import Path

from tools.cluster import processes, realpods
from tools.cluster.cluster import Cluster
from tools.cluster.realpods import KUBELET_SYSCTLS, NODE_IP, SERVICE_IP, RealPods
from trainer.catalog import INSTANCE_TYPES


def machine_files(rp: RealPods) -> Path:
    """/proc/meminfo, /sys/devices/system/cpu/online and /sys/devices/system/node as the instance
    type has them (one NUMA node, one thread per core), for the kubelet's view of the machine."""
    it = INSTANCE_TYPES[rp.instance_type]
    out = rp.dir / "machine"
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


def start(c: Cluster) -> None:
    rp: RealPods = c.level
    for sub in ("run", "varlib", "varlog", "cni-conf", "cni-ipam", "pod-logs"):
        (rp.dir / sub).mkdir(parents=True, exist_ok=True)
    machine = machine_files(rp)
    (rp.dir / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
    ready = rp.dir / "namespaces-ready"
    script = [
        "set -e",
        f"mount --bind {rp.dir / 'run'} /run",
        f"mount --bind {rp.dir / 'varlib'} /var/lib",
        f"mount --bind {rp.dir / 'varlog'} /var/log",
        f"mount --bind {c.work / 'hosts'} /etc/hosts",
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
    proc = processes.start("namespaces", args, c.work / "logs" / "namespaces.log")
    c.procs["namespaces"] = proc
    realpods.WORKS.append(c.work)
    proc.wait_ready(ready.exists, 30, "holding the namespaces")
    (rp.dir / "holder.pid").write_text(str(proc.pid))
    realpods.remove_stale()
    rp.netns = realpods.ns_inode(proc.pid, "net")
    realpods.NETNS.append(rp.netns)
    c.holder = proc.pid
    for mount in realpods.cgroup_mounts():
        realpods.PARENT_BEFORE.setdefault(mount, (mount / "k8s.io").exists())
    for mount in realpods.cgroup_v1_mounts():
        # The kubelet's cgroupRoot must exist in every hierarchy; cpuset needs its cpus and mems.
        if rp.cgroup not in realpods.CGROUPS:
            realpods.CGROUPS.append(rp.cgroup)
        for path in [mount / rp.cgroup, *(mount / rp.cgroup / n.name for n in rp.nodes)]:
            path.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (mount / f).exists():
                    (path / f).write_text((mount / f).read_text())
