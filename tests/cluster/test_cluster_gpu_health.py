"""A GPU node whose DCGM exporter reports a fatal XID is tainted NoSchedule, its healthy neighbour is not:
the real `python -m trainer.gpu_health` (what base/gpu-health runs) with the ServiceAccount and
ClusterRole of base/gpu-health on the real API server, asking a real Prometheus (the pinned build) that
scrapes DCGM-style series for two fake p5 nodes and evaluates the project's PrometheusRule.

The exporter here is a small HTTP server of the test, one port per node as one exporter pod per node;
each target carries the `node` label the exporter's ServiceMonitor relabels from the pod's node, while
the series carry the exporter's own host label with a pod's name, as without NODE_NAME, so a mapping
through that label would taint nothing. Node 0's GPU 3 reports XID 79 (fallen off the bus); node 1's
GPU 0 a single XID 13 (a program's fault), which must not taint it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from observability_support import PrometheusAPI, short_for, wait_until
from support import REPO_ROOT

from tools.cluster import dryrun, levels
from tools.cluster.build import binary
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port
from trainer import gpu_health

pytestmark = pytest.mark.cluster

RULES = REPO_ROOT / "base" / "monitoring" / "configs" / "prometheusrule-fsdp.yaml"
INSTANCE = "p5.48xlarge"
GPUS = 8
SA = ("monitoring", "fsdp-gpu-health")


def dcgm_series(xids: dict[int, int]) -> str:
    """The exporter's text format for one node: XID, ECC, row remap and power per GPU."""
    lines = []
    for name, kind in (
        ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ):
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        for gpu in range(GPUS):
            value = {"DCGM_FI_DEV_XID_ERRORS": xids.get(gpu, 0), "DCGM_FI_DEV_POWER_USAGE": 350}.get(name, 0)
            labels = (
                f'gpu="{gpu}",UUID="GPU-{gpu:08d}",pci_bus_id="00000000:{gpu:02X}:00.0",device="nvidia{gpu}",'
                'modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-exporter-x7k2p"'
            )
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def serve(body: str) -> tuple[ThreadingHTTPServer, int]:
    payload = body.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture(scope="module")
def api_cluster() -> Iterator[Cluster]:
    c = levels.start("api")
    try:
        yield c
    finally:
        c.stop()


def taints(c: Cluster, node: str) -> list[dict[str, Any]]:
    return list(c.get("nodes", name=node)["spec"].get("taints") or [])


def ours(c: Cluster, node: str) -> list[dict[str, Any]]:
    return [t for t in taints(c, node) if t["key"] == gpu_health.TAINT["key"]]


def test_the_node_with_a_fatal_xid_is_tainted_noschedule_and_its_neighbour_is_not(
    api_cluster: Cluster, tmp_path: Path
) -> None:
    c = api_cluster
    docs = dryrun.render(REPO_ROOT, "base/gpu-health")
    dryrun.ensure_namespaces(c, {"base/gpu-health": docs})
    c.apply(docs)  # the Deployment too: the API server accepts it (no controller runs it here)
    bad, good = c.add_gpu_nodes(INSTANCE, 2)
    before = {n: taints(c, n) for n in (bad, good)}  # nvidia.com/gpu, and not-ready (no kubelet here)
    # The ClusterRole allows what the tainter needs and nothing more on nodes.
    who = f"--as=system:serviceaccount:{SA[0]}:{SA[1]}"
    # (The authorizer sees a new binding within moments, not at once.)
    c.wait_for(lambda: c.kubectl_result("auth", "can-i", "patch", "nodes", who).returncode == 0, 30, "RBAC")
    assert c.kubectl_result("auth", "can-i", "delete", "nodes", who).returncode != 0
    assert c.kubectl_result("auth", "can-i", "patch", "pods", who).returncode != 0

    servers = [serve(dcgm_series({3: 79})), serve(dcgm_series({0: 13}))]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(short_for(yaml.safe_load(RULES.read_text())["spec"])))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "800ms", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"node": node, "namespace": "monitoring"}}
                    for node, (_, port) in zip((bad, good), servers, strict=True)
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(c.kubectl("create", "token", SA[1], "-n", SA[0]).strip())
    (sa / "ca.crt").write_bytes((c.work / "pki" / "apiserver.crt").read_bytes())
    log = tmp_path / "gpu-health.log"
    prom_port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": c.server.rsplit(":", 1)[1],
        "FSDP_SERVICEACCOUNT_DIR": str(sa),
        gpu_health.PROMETHEUS_ENV: f"http://127.0.0.1:{prom_port}",
        gpu_health.POLL_ENV: "0.5",
    }
    prometheus: subprocess.Popen | None = None
    tainter: subprocess.Popen | None = None
    try:
        prometheus = subprocess.Popen(
            [
                str(binary("prometheus")),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            cwd=tmp_path,
            stdout=(tmp_path / "prometheus.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        api = PrometheusAPI(prom_port)
        wait_until("Prometheus ready", api.ready, 60, (prometheus,))
        tainter = subprocess.Popen(
            [sys.executable, "-m", "trainer.gpu_health"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        procs = (prometheus, tainter)
        wait_until("both exporters scraped", lambda: len(api.query('up{job="dcgm-exporter"} == 1')) == 2, 60, procs)
        # Prometheus records the bad node only, with the XID's meaning.
        recorded = wait_until("fsdp:gpu_unhealthy recorded", lambda: api.query("fsdp:gpu_unhealthy"), 60, procs)
        assert [(r["metric"]["node"], r["metric"]["gpu"], r["metric"]["reason"]) for r in recorded] == [
            (bad, "3", "XID 79: GPU fell off the bus")
        ]
        assert len(api.query("DCGM_FI_DEV_XID_ERRORS > 0")) == 2  # node 1's XID 13 is scraped too

        wait_until("the bad node tainted", lambda: ours(c, bad), 60, procs)
        firing = wait_until("FsdpGpuNodeUnhealthy", lambda: api.firing("FsdpGpuNodeUnhealthy"), 60, procs)
        assert [(a["labels"]["node"], a["labels"]["reason"]) for a in firing] == [(bad, "XID 79: GPU fell off the bus")]
        # Six more polls of the tainter (its queries, as Prometheus counts them): nothing more happens.
        polled = api.requests("/api/v1/query")
        wait_until("six more polls", lambda: api.requests("/api/v1/query") > polled + 6, 60, procs)
        assert ours(c, bad) == [gpu_health.TAINT]  # NoSchedule, once
        assert taints(c, bad) == [*before[bad], gpu_health.TAINT]  # its own taints kept
        node = c.get("nodes", name=bad)
        assert node["metadata"]["annotations"][gpu_health.REASON_ANNOTATION] == "XID 79: GPU fell off the bus"
        assert taints(c, good) == before[good]
        lines = [line for line in log.read_text().splitlines() if "tainted node" in line]
        assert lines == [
            f"gpu-health: tainted node {bad} fsdp-gitops/gpu-unhealthy=true:NoSchedule (XID 79: GPU fell off the bus)"
        ], log.read_text()

        # The documented removal works; while the sign is still there, the node is tainted again.
        # (The removal is seen in the log: the tainter may put it back before a read here.)
        c.kubectl("taint", "node", bad, f"{gpu_health.TAINT['key']}-")
        wait_until("the bad node tainted again", lambda: log.read_text().count("tainted node") == 2, 30, procs)
        assert ours(c, bad) == [gpu_health.TAINT]
        assert ours(c, good) == []
    finally:
        for proc in (tainter, prometheus):  # started here, not by the harness
            if proc is not None:
                proc.kill()
                proc.wait(timeout=30)
        for server, _ in servers:
            server.shutdown()
