"""Webhook certificates for controllers the harness runs as processes: one helper for all of them.

The Training Operator, Kueue, JobSet and the Kubeflow Trainer each run open-policy-agent/cert-controller's
rotator: it fills a Secret with a serving certificate for the webhook Service's DNS name and injects
its CA into the webhook configurations, then waits until the files are in its certificate folder (a
kubelet's Secret volume in a pod). The harness does the kubelet's part, copying the Secret's files into
the folder it binds there, and makes the certificate's host name resolve to 127.0.0.1 in the hosts file
the API server's private mount namespace sees, so the webhooks can be called by URL on that name.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

CERT_FILES = ("ca.crt", "tls.crt", "tls.key")
# Hard-coded in the Training Operator, JobSet and the Trainer (cert-controller's default folder).
DEFAULT_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"


def add_host(cluster: Any, host: str) -> None:
    """Make `host` resolve to 127.0.0.1 for the API server (and every component in its namespaces)."""
    hosts = Path(cluster.work) / "hosts"
    lines = hosts.read_text().splitlines() if hosts.exists() else []
    if not any(host in line.split() for line in lines):
        # In place (same inode): the private mount namespaces see a bind mount of this file.
        with open(hosts, "a") as f:
            f.write(f"127.0.0.1 {host}\n")


def copy_secret(cluster: Any, namespace: str, secret: str, folder: Path) -> bool:
    """What a kubelet does for a Secret volume: write the Secret's certificate files into `folder` once
    the rotator has filled all of them. True when they were written."""
    res = cluster.kubectl_result("get", "secret", "-n", namespace, secret, "-o", "json")
    data = (json.loads(res.stdout).get("data") or {}) if res.returncode == 0 else {}
    if not all(data.get(k) for k in CERT_FILES):
        return False
    folder.mkdir(parents=True, exist_ok=True)
    for k in CERT_FILES:
        (folder / k).write_bytes(base64.b64decode(data[k]))
    return True
