"""Step `flux`: Flux's source-, kustomize- and helm-controller as processes, watching all namespaces,
on loopback. They reconcile what tools/cluster/gitops.py bootstraps (a GitRepository on the `sources`
step's server and the repository's Kustomizations)."""

from __future__ import annotations

import os

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port

CONTROLLERS = ("source-controller", "kustomize-controller", "helm-controller")


def start(c: Cluster) -> None:
    env = {
        "KUBECONFIG": str(c.kubeconfig),
        "RUNTIME_NAMESPACE": "flux-system",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(c.work),
    }
    common = ["--enable-leader-election=false", "--watch-all-namespaces=true", "--events-addr=", "--log-level=info"]
    for name in CONTROLLERS:
        metrics, health = free_port(), free_port()
        args = [build.binary(name), *common, f"--metrics-addr=127.0.0.1:{metrics}", f"--health-addr=127.0.0.1:{health}"]
        if name in ("kustomize-controller", "helm-controller"):
            # A Kustomization or HelmRelease whose dependsOn is not Ready yet is looked at again
            # after this delay (30 s by default): on a chain of five that is minutes of waiting.
            args.append("--requeue-dependency=2s")
        if name == "source-controller":
            storage = free_port()
            (c.work / "flux-storage").mkdir(exist_ok=True)
            # The advertised address is where kustomize- and helm-controller download artifacts.
            args += [
                f"--storage-path={c.work / 'flux-storage'}",
                f"--storage-addr=127.0.0.1:{storage}",
                f"--storage-adv-addr=127.0.0.1:{storage}",
            ]
        proc = c.start_process(name, args, env=env)
        proc.wait_ready(lambda: c.get_url(f"http://127.0.0.1:{health}/readyz") == "ok", 60, "ready")  # noqa: B023
