"""Step `training-operator`: the Kubeflow Training Operator v1.9.4 as a process, with its upstream
standalone manifests except that the webhooks call a URL instead of a Service (a Service would send
the API server to a ClusterIP beyond loopback).

The URL's host is the name in the operator's serving certificate, training-operator.kubeflow.svc,
which resolves to 127.0.0.1 only inside the private mount namespaces (tools/cluster/certs.py); the
operator's hard-coded certificate folder under /tmp is a bind mount of a folder the harness fills from
the Secret the operator's rotator writes. Its CRDs are the ones the `crds` step installed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
from typing import Any

import yaml

from tools.cluster import build, certs, schemas
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port

WEBHOOK_HOST = "training-operator.kubeflow.svc"  # the DNS name in the operator's serving certificate
NAMESPACE = "kubeflow"
SECRET = "training-operator-webhook-cert"


def start(c: Cluster) -> None:
    c.webhook_port = free_port()
    certs.add_host(c, WEBHOOK_HOST)
    docs = [d for d in standalone() if d["kind"] != "CustomResourceDefinition"]
    c.apply(for_process(docs, c.webhook_port))
    folder = c.work / "operator-certs"
    folder.mkdir()
    health, metrics = free_port(), free_port()
    proc = c.start_process(
        "training-operator",
        [
            build.binary("training-operator"),
            "--enable-scheme=pytorchjob",
            *c.operator_flags,
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            f"--webhook-server-port={c.webhook_port}",
        ],
        env={"KUBECONFIG": str(c.kubeconfig), "PATH": "/usr/bin:/bin"},
        private_ns=True,
        mounts=[(folder, certs.DEFAULT_CERT_DIR)],
        private_tmp=True,
    )
    proc.wait_ready(lambda: certs.copy_secret(c, NAMESPACE, SECRET, folder), 120, "writing its webhook certificate")
    proc.wait_ready(lambda: c.get_url(f"http://127.0.0.1:{health}/readyz") == "ok", 240, "ready")
    # The API server now reaches the webhook through the hosts entry; one dry-run shows it.
    proc.wait_ready(lambda: webhook_answers(c), 60, "answering its webhook")


def webhook_answers(c: Cluster) -> bool:
    """A PyTorchJob without a `pytorch` container is refused by the operator's validating webhook: the
    refusal comes only while the API server reaches it."""
    bad = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "harness-probe", "namespace": "default"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "template": {"spec": {"containers": [{"name": "not-pytorch", "image": "busybox:1.37"}]}},
                }
            }
        },
    }
    res = c.kubectl_result("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bad))
    return "denied the request" in res.stderr


def standalone() -> list[dict[str, Any]]:
    """The pinned operator's standalone manifests (kustomize build of the module's overlay), cached as JSON
    by the module's folder (its version is in the path), so a start does not build and parse them again."""
    op_dir = schemas.module_dir(schemas.Source("training-operator", "github.com/kubeflow/training-operator", ()))
    key = hashlib.sha256(bytes(op_dir)).hexdigest()[:16]
    cache = build.cache_root() / "manifests" / f"training-operator-{key}.json"
    if cache.is_file():
        docs: list[dict[str, Any]] = json.loads(cache.read_text())
        return docs
    out = subprocess.run(
        [build.tool_path("kustomize"), "build", str(op_dir / "manifests" / "overlays" / "standalone")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = [d for d in yaml.load_all(out, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
    tmp.write_text(json.dumps(docs))
    os.replace(tmp, cache)
    return docs


def for_process(docs: list[dict[str, Any]], webhook_port: int) -> list[dict[str, Any]]:
    """The operator's standalone manifests for a process on loopback: no Deployment (the harness runs
    the binary), webhooks by URL on the certificate's host name instead of by Service."""
    out = []
    for doc in docs:
        if doc["kind"] == "Deployment":
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] == "ValidatingWebhookConfiguration":
            for hook in doc["webhooks"]:
                path = hook["clientConfig"].pop("service")["path"]
                hook["clientConfig"]["url"] = f"https://{WEBHOOK_HOST}:{webhook_port}{path}"
        out.append(doc)
    return out
