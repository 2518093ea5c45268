"""Step `kube-scheduler`: the pinned scheduler on loopback, as the admin."""

from __future__ import annotations

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port
from tools.cluster.steps.apiserver import component_kubeconfig_flags


def start(c: Cluster) -> None:
    port = free_port()
    proc = c.start_process(
        "kube-scheduler",
        [
            build.binary("kube-scheduler"),
            *component_kubeconfig_flags(c),
            "--leader-elect=false",
            "--feature-gates=WatchListClient=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ],
    )
    url = f"https://127.0.0.1:{port}/healthz"
    proc.wait_ready(lambda: c.get_url(url, insecure=True) == "ok", 60, "healthy")
