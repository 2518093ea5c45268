"""The alert rules and the Grafana dashboard: they parse, their alerts fire when they should, and they
name only metrics that exist.

promtool is the pinned one built from tools/cluster/prometheus (tools.cluster.build). "Exist" means:
a DCGM field the exporter is configured with (values.customMetrics of the dcgm-exporter HelmRelease,
each of them a field of the upstream exporter's list vendored in tests/data/monitoring/), a series
the trainer's own collector (trainer.metrics.TrainerCollector) emits, a recording rule of the same
file, or one of the few Prometheus and kube-state-metrics series in OTHER_METRICS.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from observability_support import (
    DASHBOARD,
    DCGM_RELEASE,
    RULES,
    exporter_dcgm_fields,
    metric_names,
    plain_promql,
    trainer_metric_names,
)

from tools.cluster.build import binary
from trainer import gpu_health

DATA = Path(__file__).resolve().parent / "data" / "monitoring"
UNIT_TESTS = DATA / "alerts.test.yaml"
UPSTREAM_DCGM_FIELDS = DATA / "dcgm-exporter-default-counters.csv"

# Series from neither the DCGM exporter nor the trainer, with where they are defined:
OTHER_METRICS = {
    "up",  # Prometheus, one per scrape target
    "kube_job_failed",  # kube-state-metrics docs/metrics/workload/job-metrics.md (STABLE)
    "kube_job_status_failed",  # the same page (STABLE): reason BackoffLimitExceeded, DeadlineExceeded, Evicted, ""
    "kube_node_status_capacity",  # kube-state-metrics docs/metrics/cluster/node-metrics.md (STABLE)
}


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["spec"]["groups"]


def rules() -> Iterator[dict]:
    for group in rule_groups():
        yield from group["rules"]


def dashboard_expressions() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            # label_values(<series selector>, label): the selector is the PromQL part.
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
            assert match, var["query"]["query"]
            exprs.append(match.group(1))
    return exprs


def upstream_dcgm_fields() -> set[str]:
    fields = set()
    for line in UPSTREAM_DCGM_FIELDS.read_text().splitlines():
        match = re.match(r"#?\s*(DCGM_\w+)\s*,", line)
        if match:
            fields.add(match.group(1))
    return fields


def known_metrics() -> set[str]:
    recorded = {r["record"] for r in rules() if "record" in r}
    return exporter_dcgm_fields() | trainer_metric_names() | recorded | OTHER_METRICS


def unknown_metrics(exprs: list[str]) -> dict[str, set[str]]:
    known = known_metrics()
    return {e: metric_names(e) - known for e in exprs if metric_names(e) - known}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("promtool")), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def write_rules(tmp_path: Path, groups: list[dict]) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


# Fast checks: names and structure.


def test_metric_name_extraction_ignores_functions_labels_and_ranges():
    expr = (
        'max by (node, gpu) (rate(DCGM_FI_DEV_THERMAL_VIOLATION{gpu=~"0|1"}[5m])) / 1e9 > 0.1 '
        'and on (run) label_replace(up{job="x"} == 1, "a", "$1", "b", "(.+)") unless fsdp:x:sum offset 5m'
    )
    assert metric_names(expr) == {"DCGM_FI_DEV_THERMAL_VIOLATION", "up", "fsdp:x:sum"}


def test_rules_and_dashboard_name_only_metrics_that_exist():
    rule_exprs = [r["expr"] for r in rules()]
    dash_exprs = [plain_promql(e) for e in dashboard_expressions()]
    assert unknown_metrics(rule_exprs + dash_exprs) == {}
    # The check sees the metrics the rules rely on (it would pass vacuously on an empty list).
    used = set().union(*map(metric_names, rule_exprs + dash_exprs))
    assert {
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_GPU_UTIL",
        "fsdp_tokens_per_second",
        "fsdp_step",
        "fsdp_total_steps",
        "up",
        "kube_job_failed",
    } <= used


def test_gpu_series_are_grouped_by_the_node_label_we_set():
    # `node` comes from the exporter ServiceMonitor's relabelling, independent of the exporter version;
    # the exporter's own host label changed case after 4.5.3-4.8.2 (NVIDIA/dcgm-exporter d5e5f51,
    # "Rename Hostname label to hostname"), so neither spelling is safe to group by.
    exprs = [r["expr"] for r in rules()] + dashboard_expressions()
    assert not [e for e in exprs if re.search(r"\b[Hh]ostname\b", e)]
    release = yaml.safe_load(DCGM_RELEASE.read_text())
    relabel = release["spec"]["values"]["serviceMonitor"]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"} in relabel
    assert all("by (node, gpu)" in e for e in exprs if "DCGM_FI_DEV_GPU_TEMP" in e)


def test_an_unknown_metric_is_reported():
    misspelt = [
        'sum by (run) (fsdp_tokens_per_sec{run=~".*"})',
        "max(DCGM_FI_DEV_GPU_TEMPERATURE) > 85",
        "rate(fsdp_tokens_total[5m])",
    ]
    assert unknown_metrics(misspelt) == {
        misspelt[0]: {"fsdp_tokens_per_sec"},
        misspelt[1]: {"DCGM_FI_DEV_GPU_TEMPERATURE"},
    }


def test_exporter_fields_are_upstream_dcgm_exporter_fields():
    enabled = exporter_dcgm_fields()
    assert enabled - upstream_dcgm_fields() == set()
    # The throttling alerts need the violation counters, which upstream leaves off by default.
    assert {"DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_GPU_UTIL"} <= enabled


def test_trainer_serves_no_created_series_and_three_counters():
    names = trainer_metric_names()
    assert not {n for n in names if n.endswith("_created")}
    assert {"fsdp_tokens_total", "fsdp_efa_transmit_bytes_total", "fsdp_efa_receive_bytes_total"} <= names
    # The optional families are in the list the checks compare with (the hang alert reads the first).
    assert {"fsdp_progress_deadline_timestamp_seconds", "fsdp_checkpoint_stall_seconds", "fsdp_total_steps"} <= names


def test_every_alert_has_a_firing_and_a_silent_unit_test():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    silent = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert alerts == firing == silent, (alerts, firing, silent)
    assert {
        "FsdpGpuXidError",
        "FsdpGpuThermalThrottling",
        "FsdpGpuPowerThrottling",
        "FsdpGpuIdleInActiveRun",
        "FsdpThroughputDrop",
        "FsdpTrainerMetricsMissing",
        "FsdpTrainingHung",
        "FsdpNcclPreflightFailed",
        "FsdpNcclPreflightNotRun",
        "FsdpGpuNodeUnhealthy",
    } <= alerts


# promtool: parse and unit tests.


@pytest.mark.cluster
def test_rules_pass_promtool_check(tmp_path):
    proc = promtool("check", "rules", str(write_rules(tmp_path, rule_groups())))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(list(rules()))} rules found" in proc.stdout


@pytest.mark.cluster
def test_dashboard_expressions_parse(tmp_path):
    exprs = [plain_promql(e) for e in dashboard_expressions()]
    group = {"name": "dashboard", "rules": [{"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}
    proc = promtool("check", "rules", str(write_rules(tmp_path, [group])))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # promtool rejects a broken expression (so the check above is not vacuous).
    group["rules"].append({"record": "dashboard:broken", "expr": "sum by (run (fsdp_loss)"})
    proc = promtool("check", "rules", str(write_rules(tmp_path, [group])))
    assert proc.returncode != 0 and "dashboard:broken" in proc.stdout + proc.stderr


@pytest.mark.cluster
def test_alerts_fire_and_stay_silent_in_promtool_unit_tests(tmp_path):
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    write_rules(tmp_path, rule_groups())
    proc = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


# Each broken rule misses a case of its unit test: a threshold too high (the 60% power throttling
# goes unseen), the deadline read the wrong way round (fires on every run not yet due), any XID taken
# for a fatal one (the healthy node's XID 13 would taint it). Rule (alert or record) -> (text,
# replacement, the alert whose unit test fails).
BROKEN_RULES = {
    "FsdpGpuPowerThrottling": ("> 0.5", "> 0.7", "FsdpGpuPowerThrottling"),
    "FsdpTrainingHung": (
        'time() - fsdp_progress_deadline_timestamp_seconds{job="fsdp-trainer"}',
        'fsdp_progress_deadline_timestamp_seconds{job="fsdp-trainer"} - time()',
        "FsdpTrainingHung",
    ),
    "fsdp:gpu_unhealthy": ("DCGM_FI_DEV_XID_ERRORS == 79", "DCGM_FI_DEV_XID_ERRORS > 0", "FsdpGpuNodeUnhealthy"),
}


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(BROKEN_RULES))
def test_unit_tests_catch_a_broken_rule(tmp_path, name):
    old, new, alert = BROKEN_RULES[name]
    groups = rule_groups()
    changed = 0
    for group in groups:
        for rule in group["rules"]:
            if name in (rule.get("alert"), rule.get("record")) and old in rule["expr"]:
                rule["expr"] = rule["expr"].replace(old, new)
                changed += 1
    assert changed == 1
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    write_rules(tmp_path, groups)
    proc = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0 and f"alertname: {alert}" in proc.stdout + proc.stderr


def test_the_tainters_query_is_the_one_the_unit_tests_evaluate():
    # trainer.gpu_health taints by this query; alerts.test.yaml holds its expected result.
    exprs = [
        case["expr"]
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test.get("promql_expr_test", [])
    ]
    assert gpu_health.QUERY in exprs
    assert metric_names(gpu_health.QUERY) == {"fsdp:gpu_unhealthy"} <= known_metrics()
