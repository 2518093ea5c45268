"""Step `kube-controller-manager`: service accounts, garbage collection, Deployments, DaemonSets, Jobs,
PV binding; no cloud controllers."""

from __future__ import annotations

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port
from tools.cluster.steps.apiserver import component_kubeconfig_flags


def start(c: Cluster) -> None:
    port = free_port()
    pki = c.work / "pki"
    proc = c.start_process(
        "kube-controller-manager",
        [
            build.binary("kube-controller-manager"),
            *component_kubeconfig_flags(c),
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'apiserver.crt'}",
            "--use-service-account-credentials=false",
            "--feature-gates=WatchListClient=false",
            "--controllers=*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller",
            # kwok posts the fake nodes' status; on a busy machine a late heartbeat must not mark their
            # pods unready (nothing sets them ready again: no kubelet runs them).
            "--node-monitor-grace-period=1h",
        ],
    )
    url = f"https://127.0.0.1:{port}/healthz"
    proc.wait_ready(lambda: c.get_url(url, insecure=True) == "ok", 60, "healthy")
