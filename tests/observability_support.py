"""What the observability tests share: the monitoring configuration's files, the metric names a PromQL
expression selects and the series the trainer and the DCGM exporter emit (the rules' and the
dashboard's "exist"), a small client of a real Prometheus's HTTP API with a bounded wait
(tests/test_observability_prometheus.py, test_observability_dashboard.py, cluster/test_cluster_gpu_health.py),
and a short CPU training run publishing progress annotations to an API server
(test_observability_progress.py, cluster/test_cluster_progress.py)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import REPO_ROOT
from trainer_support import finish, output_overrides, read_metrics, torchrun_cmd, trainer_env

from trainer.metrics import EFA_COUNTERS, TrainerCollector

MONITORING = REPO_ROOT / "base" / "monitoring"
RULES = MONITORING / "configs" / "prometheusrule-fsdp.yaml"
DASHBOARD = MONITORING / "configs" / "dashboards" / "fsdp-gpus.json"
DCGM_RELEASE = MONITORING / "controllers" / "dcgm-exporter.yaml"
WAIT_S = 180  # bounded waits; a cold CPU run needs tens of seconds before its first step

PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}
# Grafana variables, replaced by values that make each expression plain PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def plain_promql(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced ($var inside matchers: any value)."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers outside strings, label matchers, ranges and
    label lists that are not functions, keywords, durations or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = match.groups()
        if call or word.lower() in PROMQL_KEYWORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def exporter_dcgm_fields() -> set[str]:
    release = yaml.safe_load(DCGM_RELEASE.read_text())
    csv = release["spec"]["values"]["customMetrics"]
    return {line.split(",")[0].strip() for line in csv.splitlines() if line.strip() and not line.startswith("#")}


def trainer_metric_names() -> set[str]:
    """Every series name the trainer's collector emits on global rank 0 of a node with EFA, once it has
    a record, a progress deadline and a complete checkpoint (from the code itself)."""
    with tempfile.TemporaryDirectory() as sysfs:
        counters = Path(sysfs) / "rdmap0s0" / "ports" / "1" / "hw_counters"
        counters.mkdir(parents=True)
        for name, _, _ in EFA_COUNTERS:
            (counters / name).write_text("1\n")
        collector = TrainerCollector({"model": "tiny"}, job_wide=True, node_ranks=1, infiniband=Path(sysfs))
        collector.update({**{key: 1.0 for key in TrainerCollector.JOB_GAUGES}, "peak_mem_gib": 1.0}, 1)
        collector.deadline = 1.0
        collector.checkpoint = {key: 1.0 for key in TrainerCollector.CHECKPOINT_GAUGES}
        registry = CollectorRegistry()
        registry.register(collector)
        return {s.name for family in registry.collect() for s in family.samples}


# A real Prometheus -------------------------------------------------------------------------------------


def wait_until(what: str, check: Callable[[], Any], timeout: float = WAIT_S, procs: tuple = ()) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        for p in procs:
            assert p.poll() is None, f"{p.args[:3]} exited with {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.5)


class PrometheusAPI:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}/api/v1/"

    def get(self, path: str, **params: Any) -> Any:
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("query", query=expr)["result"]

    def firing(self, alertname: str) -> list[dict]:
        return [
            a for a in self.get("alerts")["alerts"] if a["labels"]["alertname"] == alertname and a["state"] == "firing"
        ]

    def requests(self, handler: str) -> float:
        """The requests Prometheus has answered at `handler` (an HTTP API path, "/api/v1/query"), as its
        own prometheus_http_requests_total counts them; read from /metrics, which is not one of them."""
        with urllib.request.urlopen(self.base.replace("/api/v1/", "/metrics"), timeout=10) as resp:
            text = resp.read().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "prometheus_http_requests_total" and s.labels.get("handler") == handler
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base.replace("/api/v1/", "/-/ready"), timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False


def short_for(spec: dict) -> dict:
    for group in spec["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
    return spec


# Progress annotations ---------------------------------------------------------------------------------

POD = "tiny-run-worker-0"  # the pod the publisher patches
STEPS = 12  # the length of run_trainer's run


def in_cluster_env(sa: Path, port: int, interval_s: float) -> dict[str, str]:
    """The environment of a pod that asked for progress annotations, its API server on loopback at `port`
    and its service account token in the folder `sa`."""
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(port),
        "FSDP_POD_NAME": POD,
        "FSDP_SERVICEACCOUNT_DIR": str(sa),
        "FSDP_PROGRESS_INTERVAL_S": str(interval_s),
    }


def run_trainer(tmp_path: Path, env: dict[str, str]) -> tuple[str, list[dict]]:
    """A STEPS-step CPU run under torchrun with `env` added, which must succeed: its log and its records."""
    out = tmp_path / "run"
    cmd = torchrun_cmd([*output_overrides(out), f"training.max_steps={STEPS}", "checkpoint.interval_steps=1000"])
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log = finish(proc)
    assert proc.returncode == 0, log[-4000:]
    return log, read_metrics(out)
