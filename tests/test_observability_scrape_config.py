"""tools/cluster/scrape.py: the scrape configuration prometheus-operator generates for the repository's
PodMonitor and ServiceMonitor (base/monitoring/configs). The real-pods test
(tests/cluster/test_realpods_runs.py) shows a real Prometheus discovering and scraping the run's pods with it."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from tools.cluster import scrape

CONFIGS = REPO_ROOT / "base" / "monitoring" / "configs"


def monitor(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((CONFIGS / name).read_text())
    doc["metadata"]["namespace"] = "monitoring"  # the configs overlay's namespace
    for ep in doc["spec"].get("podMetricsEndpoints", []):
        for rule in ep.get("relabelings", []):
            rule.setdefault("action", "replace")  # the CRD's default, as the API server returns it
    return doc


def test_the_trainer_podmonitor_becomes_the_operators_scrape_job() -> None:
    (cfg,) = scrape.pod_monitor_configs(monitor("podmonitor-trainer.yaml"))
    assert cfg["job_name"] == "podMonitor/monitoring/fsdp-trainer/0"
    assert cfg["kubernetes_sd_configs"] == [{"role": "pod"}]  # namespaceSelector any: every namespace
    assert cfg["scrape_interval"] == "15s" and cfg["metrics_path"] == "/metrics"
    rel = cfg["relabel_configs"]
    keeps = [r for r in rel if r.get("action") == "keep"]
    assert keeps[0] == {
        "action": "keep",
        "source_labels": [
            "__meta_kubernetes_pod_label_app_kubernetes_io_name",
            "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name",
        ],
        "regex": "(fsdp-trainer);true",
    }
    assert keeps[1] == {
        "action": "keep",
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "metrics",
    }
    targets = [r.get("target_label") for r in rel]
    # The default job, then the jobLabel's value over it, then the endpoint and the PodMonitor's own rules.
    assert targets.index("job") < len(targets) - 1 - targets[::-1].index("job") < targets.index("endpoint")
    assert targets.index("endpoint") < targets.index("run") < targets.index("node")
    assert rel[-1] == {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": "0;|.+;.+", "action": "keep"}
    assert "static_configs" not in cfg


def test_the_test_interval_and_kubeconfig_are_the_only_additions() -> None:
    (cfg,) = scrape.pod_monitor_configs(monitor("podmonitor-trainer.yaml"), interval="1s", kubeconfig=Path("/k"))
    assert cfg["scrape_interval"] == "1s"
    assert cfg["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "/k"}]


def test_the_etcd_servicemonitor_discovers_endpoints_in_its_namespace() -> None:
    (cfg,) = scrape.service_monitor_configs(monitor("servicemonitor-etcd.yaml"))
    assert cfg["job_name"] == "serviceMonitor/monitoring/etcd/0"
    assert cfg["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": ["fsdp-system"]}}]
    assert {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "client"} in cfg[
        "relabel_configs"
    ]


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("spec", "sampleLimit"), 100, "sampleLimit"),
        (("spec", "podMetricsEndpoints", 0, "tlsConfig"), {"insecureSkipVerify": True}, "tlsConfig"),
        (
            ("spec", "podMetricsEndpoints", 0, "relabelings", 0, "unknown"),
            1,
            "relabelings[0]: unsupported field(s) unknown",
        ),
        (("spec", "namespaceSelector", "labelSelector"), {}, "namespaceSelector: unsupported field(s) labelSelector"),
    ],
)
def test_a_field_the_translation_lacks_is_an_error_naming_it(path: tuple, value: Any, named: str) -> None:
    doc = copy.deepcopy(monitor("podmonitor-trainer.yaml"))
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(scrape.UnsupportedField, match=re.escape(named)) as e:
        scrape.scrape_configs([doc])
    assert "PodMonitor monitoring/fsdp-trainer" in str(e.value)


@pytest.mark.cluster
def test_promtool_accepts_the_generated_configuration(tmp_path: Path) -> None:
    from tools.cluster.build import binary

    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    configs = scrape.scrape_configs(
        [monitor("podmonitor-trainer.yaml"), monitor("servicemonitor-etcd.yaml")], kubeconfig=tmp_path / "kubeconfig"
    )
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": configs}))
    res = subprocess.run(
        [str(binary("promtool")), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
