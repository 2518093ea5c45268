"""Step `containerd` (the real-pods level): one containerd per node with its runc shim, runc (seccomp)
and the CNI bridge, each on a hard-linked copy of a root prepared once per set of images (the images
imported and unpacked: tools/cluster/realpods.py's docstring)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from tools.cluster import build, processes
from tools.cluster.cluster import Cluster
from tools.cluster.processes import Process, StartError
from tools.cluster.realpods import NODE_IP, PREPARED_ROOTS_KEPT, RealPods, ctr, link_copy, prune_prepared_roots


def config_file(rp: RealPods, root: Path, state: Path, sock: Path) -> Path:
    pause = rp.images[0].name
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
    conf_dir = "{rp.dir / "cni-conf"}"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
    path = state.parent / f"{state.name}.toml"
    path.write_text(config)
    return path


def run(c: Cluster, rp: RealPods, name: str, root: Path, state: Path) -> tuple[Process, Path]:
    state.mkdir(parents=True, exist_ok=True)
    sock = state.parent / f"{state.name}.sock"
    path = config_file(rp, root, state, sock)
    binary = build.binary("containerd")
    build.binary("containerd-shim-runc-v2")
    env = {**os.environ, "PATH": f"{binary.parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = c.start_process(name, [str(binary), f"--config={path}"], env=env)
    proc.wait_ready(lambda: ctr(sock, "version").returncode == 0, 60, "answering")
    return proc, sock


def prepared_root(c: Cluster, rp: RealPods) -> Path:
    """containerd's root with every image imported and unpacked, prepared once per set of images."""
    key = hashlib.sha256(json.dumps([[i.name, i.digest] for i in rp.images]).encode()).hexdigest()[:16]
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
            link_copy(earlier[-1].parent / "root", tmp)
        proc, sock = run(c, rp, "containerd-prepare", tmp, rp.dir / "containerd-prepare")
        try:
            for img in rp.images:
                res = ctr(sock, "images", "import", "--snapshotter=overlayfs", str(img.archive))
                if res.returncode != 0:
                    raise StartError(f"ctr images import {img.archive} failed: {res.stderr.strip()}")
        finally:
            processes.stop(proc)
            c.procs.pop("containerd-prepare", None)
        os.replace(tmp, root)
        (base / "ready").touch()
    prune_prepared_roots(base.parent, keep=PREPARED_ROOTS_KEPT)
    return root


def start(c: Cluster) -> None:
    rp: RealPods = c.level
    """One containerd per node, each on a hard-linked copy of the prepared root (module docstring)."""
    prepared = prepared_root(c, rp)
    (rp.dir / "cni-conf" / "10-realpods.conflist").write_text(
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
                            "dataDir": str(rp.dir / "cni-ipam"),
                            "ranges": [[{"subnet": "10.88.0.0/16", "rangeStart": "10.88.1.0", "gateway": NODE_IP}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    }
                ],
            }
        )
    )
    for node in rp.nodes:
        root = rp.dir / f"containerd-{node.name}-root"
        link_copy(prepared, root)
        _, sock = run(c, rp, f"containerd-{node.name}", root, rp.dir / f"containerd-{node.name}")
        listed = ctr(sock, "images", "ls", "-q").stdout.split()
        missing = [i.name for i in rp.images if i.name not in listed]
        if missing:
            raise StartError(f"containerd's prepared root lacks {missing} (under {prepared}); remove it to rebuild")
        rp.socks[node.name] = sock
