"""Step `kube-apiserver`: the pinned API server (tools/cluster/build.py) with token auth, RBAC and the
`pki` step's serving certificate, in a private mount namespace (the hosts file); writes the kubeconfig
every later component and the client use."""

from __future__ import annotations

import ssl

import yaml

from tools.cluster import build
from tools.cluster.client import TOKEN
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port


def start(c: Cluster) -> None:
    port = c.apiserver_port or free_port()
    pki = c.work / "pki"
    c.server = f"https://127.0.0.1:{port}"
    proc = c.start_process(
        "kube-apiserver",
        [
            build.binary("kube-apiserver"),
            f"--etcd-servers={c.etcd_url}",
            f"--bind-address={'0.0.0.0' if c.holder else '127.0.0.1'}",  # 0.0.0.0 only in its own netns
            f"--secure-port={port}",
            f"--advertise-address={c.advertise_address}",
            *c.apiserver_flags,
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--anonymous-auth=false",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--storage-media-type=application/json",
            f"--cert-dir={c.work / 'apiserver-certs'}",
            # With WatchList on, the server turns every watch from resourceVersion "" or "0" that allows
            # bookmarks into a watch stream (SendInitialEvents), which etcd 3.5.1 cannot serve (no
            # RequestWatchProgress): such a watch ends at once with an error. kwok opens all its watches
            # at "0", so it saw pod and node changes only at its backed-off relists, up to ~30 s late.
            # Off, such a watch is the classic one: the current objects as ADDED, then the changes.
            "--feature-gates=WatchList=false",
        ],
        private_ns=True,
    )
    c.kubeconfig = c.work / "kubeconfig"
    cluster = {"server": c.server, "certificate-authority": str(pki / "apiserver.crt")}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "harness",
        "clusters": [{"name": "harness", "cluster": cluster}],
        "users": [{"name": "admin", "user": {"token": TOKEN}}],
        "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": "admin"}}],
    }
    c.kubeconfig.write_text(yaml.safe_dump(config))
    c.ssl_context = ssl.create_default_context(cafile=str(pki / "apiserver.crt"))
    proc.wait_ready(lambda: c.api_get("/readyz") == "ok", 120, "ready")


def component_kubeconfig_flags(c: Cluster) -> list[str]:
    """The kubeconfig flags of the scheduler and the controller-manager (the admin's kubeconfig)."""
    k = f"--kubeconfig={c.kubeconfig}"
    return [k, f"--authentication-kubeconfig={c.kubeconfig}", f"--authorization-kubeconfig={c.kubeconfig}"]
