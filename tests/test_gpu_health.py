"""trainer.gpu_health on its own (what it reads from Prometheus' answer, the patch it sends, bad
settings) and base/gpu-health's manifests. On a real API server and Prometheus:
tests/cluster/test_cluster_gpu_health.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from trainer import gpu_health

BASE = REPO_ROOT / "base" / "gpu-health"


@pytest.fixture
def prometheus() -> Iterator[tuple[str, dict[str, Any]]]:
    """A stand-in for Prometheus' query API answering with `answer["body"]`; `answer["query"]` is the
    query it was asked."""
    answer: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            from urllib.parse import parse_qs, urlparse

            url = urlparse(self.path)
            answer["path"], answer["query"] = url.path, parse_qs(url.query)["query"][0]
            payload = json.dumps(answer["body"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", answer
    finally:
        server.shutdown()


def vector(*labels: dict[str, str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [1.0, "1"]} for m in labels]},
    }


def test_unhealthy_nodes_groups_the_reasons_by_node(prometheus):
    url, answer = prometheus
    answer["body"] = vector(
        {"node": "n2", "reason": "row remap failure"},
        {"node": "n1", "reason": "XID 79: GPU fell off the bus"},
        {"node": "n2", "reason": "XID 48: double-bit ECC error"},
        {"reason": "no node label"},  # a series without the relabelled node is no node's
    )
    assert gpu_health.unhealthy_nodes(url) == {
        "n1": ["XID 79: GPU fell off the bus"],
        "n2": ["XID 48: double-bit ECC error", "row remap failure"],
    }
    assert answer["path"] == "/api/v1/query" and answer["query"] == gpu_health.QUERY


def test_a_prometheus_error_is_an_error(prometheus):
    url, answer = prometheus
    answer["body"] = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    with pytest.raises(ValueError, match="bad_data: parse error"):
        gpu_health.unhealthy_nodes(url)


def test_the_patch_keeps_the_nodes_taints_and_guards_them_by_resource_version():
    node = {
        "metadata": {"name": "n1", "resourceVersion": "42"},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
    }
    assert not gpu_health.tainted(node)
    patch = gpu_health.taint_patch(node, ["XID 79: GPU fell off the bus", "row remap failure"])
    assert patch == {
        "metadata": {
            "resourceVersion": "42",
            "annotations": {gpu_health.REASON_ANNOTATION: "XID 79: GPU fell off the bus; row remap failure"},
        },
        "spec": {
            "taints": [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                {"key": "fsdp-gitops/gpu-unhealthy", "value": "true", "effect": "NoSchedule"},
            ]
        },
    }
    assert gpu_health.tainted({"spec": patch["spec"]})
    assert gpu_health.taint_patch({"metadata": {"resourceVersion": "1"}, "spec": {}}, ["x"])["spec"]["taints"] == [
        gpu_health.TAINT
    ]


@pytest.mark.parametrize(("poll", "message"), [("soon", "is not a number of seconds"), ("0", "must be above 0")])
def test_a_bad_poll_interval_is_one_line_and_exit_2(capsys, poll, message):
    assert gpu_health.main({gpu_health.POLL_ENV: poll, "KUBERNETES_SERVICE_HOST": "127.0.0.1"}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and gpu_health.POLL_ENV in err and message in err


def docs() -> dict[str, dict[str, Any]]:
    out = {}
    for name in ("rbac.yaml", "deployment.yaml"):
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            out[doc["kind"]] = doc
    return out


def test_the_deployment_runs_the_module_against_kube_prometheus_stacks_prometheus():
    d = docs()
    (container,) = d["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "trainer.gpu_health"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[gpu_health.PROMETHEUS_ENV] == gpu_health.PROMETHEUS_URL
    # The Service kube-prometheus-stack names after its HelmRelease: <release>-prometheus.
    release = yaml.safe_load((REPO_ROOT / "base/monitoring/controllers/kube-prometheus-stack.yaml").read_text())
    assert gpu_health.PROMETHEUS_URL == f"http://{release['metadata']['name']}-prometheus.monitoring.svc:9090"
    assert float(env[gpu_health.POLL_ENV]) > 0
    assert d["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == d["ServiceAccount"]["metadata"]["name"]
    assert yaml.safe_load((BASE / "kustomization.yaml").read_text())["namespace"] == "monitoring"
    assert (
        "../../gpu-health"
        in yaml.safe_load((REPO_ROOT / "base/infrastructure/configs/kustomization.yaml").read_text())["resources"]
    )


def test_the_role_touches_nodes_only_and_the_taint_never_evicts():
    role = docs()["ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]
    assert gpu_health.TAINT["effect"] == "NoSchedule"


def test_the_dcgm_exporter_keeps_running_on_a_tainted_node():
    # Else a restarted exporter pod stays off the node and its signs vanish as if it were repaired.
    release = yaml.safe_load((REPO_ROOT / "base/monitoring/controllers/dcgm-exporter.yaml").read_text())
    tolerations = release["spec"]["values"]["tolerations"]
    assert {"key": gpu_health.TAINT["key"], "operator": "Exists", "effect": "NoSchedule"} in tolerations
