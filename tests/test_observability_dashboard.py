"""The Grafana dashboard (base/monitoring/configs/dashboards/fsdp-gpus.json) shows only series that exist,
under labels they carry, and every panel says what it shows and in which unit.

"Exist" is narrower here than for the rules (tests/test_observability_rules.py): a series the trainer's
collector emits (trainer.metrics.TrainerCollector, every optional family included), a field the DCGM
exporter is configured to collect (values.customMetrics of its HelmRelease), or one of the series
Prometheus writes for every target of a scrape job. No recording rule: the dashboard works without
the PrometheusRule. The labels a trainer series can be grouped or filtered by are those the scrape
configuration prometheus-operator generates for the PodMonitor gives it (tools/cluster/scrape.py, the
translation the real-pods tests run Prometheus with), plus `instance` and the family's own labels.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from observability_support import (
    DASHBOARD,
    DCGM_RELEASE,
    MONITORING,
    RULES,
    PrometheusAPI,
    exporter_dcgm_fields,
    metric_names,
    plain_promql,
    short_for,
    trainer_metric_names,
    wait_until,
)
from support import REPO_ROOT
from trainer_support import free_port

from tools.cluster.build import binary
from tools.cluster.scrape import pod_monitor_configs
from trainer.metrics import EFA_COUNTERS, PrometheusExporter, TrainerCollector

PODMONITOR = MONITORING / "configs" / "podmonitor-trainer.yaml"
CONFIGS_KUSTOMIZATION = MONITORING / "configs" / "kustomization.yaml"

# Prometheus writes these for every target of every scrape job ("Jobs and instances", automatically
# generated series); the trainer's PodMonitor gets them like any other job.
SCRAPE_SERIES = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
}
# Labels of a trainer family beyond the target's (trainer/metrics.py: the EFA counters' device and port).
FAMILY_LABELS = {"device", "port"}
# The DCGM exporter's own per-GPU labels (the exporter's output: gpu, UUID, device, modelName); the
# HelmRelease's ServiceMonitor relabelings add the rest (node).
DCGM_EXPORTER_LABELS = {"gpu", "UUID", "device", "modelName"}
# Grafana unit ids this dashboard may use (grafana/grafana packages/grafana-data/src/valueFormats/
# categories.ts), plus Grafana's custom `suffix:<text>` form. An unknown id is shown as a raw suffix.
GRAFANA_UNITS = {"none", "short", "percent", "percentunit", "sci", "celsius", "watt", "s", "bytes", "Bps", "MBs"}


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows, rows themselves too."""
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, plain PromQL) of every panel target and of every query variable's selector."""
    out = [(f"panel {p['title']!r}", plain_promql(t["expr"])) for p in panels(dash) for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"]["query"])
            assert match, var["query"]["query"]
            out.append((f"variable {var['name']!r}", plain_promql(match.group(1)) + f" by ({match.group(2)})"))
    return out


def labels_used(expr: str) -> set[str]:
    """Label names in matchers and in by/without/on/ignoring lists."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    used = {m.group(1) for m in re.finditer(r"(\w+)\s*(?:=~|!~|!=|=)", " ".join(re.findall(r"\{([^}]*)\}", text)))}
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        used |= {name.strip() for name in group.split(",") if name.strip()}
    return used


def trainer_target_labels() -> set[str]:
    """The labels the generated scrape configuration gives the trainer's targets."""
    monitor = yaml.safe_load(PODMONITOR.read_text())
    monitor["metadata"]["namespace"] = yaml.safe_load(CONFIGS_KUSTOMIZATION.read_text())["namespace"]
    labels = {"instance"}  # Prometheus sets it from __address__ where no rule does
    for config in pod_monitor_configs(monitor):
        targets = {rule.get("target_label", "_") for rule in config["relabel_configs"]}
        labels |= {label for label in targets if not label.startswith("_")}
    return labels


def dcgm_labels() -> set[str]:
    release = yaml.safe_load(DCGM_RELEASE.read_text())
    relabel = release["spec"]["values"]["serviceMonitor"]["relabelings"]
    return DCGM_EXPORTER_LABELS | {r["targetLabel"] for r in relabel}


def problems(dash: dict[str, Any]) -> list[str]:
    """What is wrong with a dashboard, one line each (empty when nothing is)."""
    trainer, dcgm = trainer_metric_names(), exporter_dcgm_fields()
    scrape_labels, gpu_labels = trainer_target_labels(), dcgm_labels()
    out = []
    for where, expr in expressions(dash):
        names = metric_names(expr)
        for name in sorted(names - trainer - dcgm - SCRAPE_SERIES):
            out.append(f"{where}: {name} is exported by neither the trainer nor the DCGM exporter nor a scrape")
        allowed = set()
        if names & (trainer | SCRAPE_SERIES):
            allowed |= scrape_labels | FAMILY_LABELS
        if names & dcgm:
            allowed |= gpu_labels
        for label in sorted(labels_used(expr) - allowed if allowed else set()):
            out.append(f"{where}: label {label} is not on the series {sorted(names)}")
    ids = [p["id"] for p in panels(dash)]
    if len(ids) != len(set(ids)):
        out.append(f"panel ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}")
    for panel in panels(dash):
        title = panel.get("title", "").strip()
        if not title:
            out.append(f"panel {panel['id']}: no title")
        if panel["type"] == "row":
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if not (unit in GRAFANA_UNITS or unit.startswith("suffix:")):
            out.append(f"panel {title or panel['id']!r}: unit {unit!r} is not a Grafana unit id")
        if not panel.get("targets"):
            out.append(f"panel {title or panel['id']!r}: no query")
    return out


def overlaps(dash: dict[str, Any]) -> list[tuple[str, str]]:
    boxes = [(p["title"], p["gridPos"]) for p in dash["panels"]]
    out = []
    for i, (a, pa) in enumerate(boxes):
        for b, pb in boxes[i + 1 :]:
            if (
                pa["x"] < pb["x"] + pb["w"]
                and pb["x"] < pa["x"] + pa["w"]
                and pa["y"] < pb["y"] + pb["h"]
                and pb["y"] < pa["y"] + pa["h"]
            ):
                out.append((a, b))
    return out


def test_dashboard_names_only_exported_series_with_their_labels_and_units():
    dash = load()
    assert problems(dash) == []
    assert overlaps(dash) == []


def test_trainer_labels_come_from_the_generated_scrape_config():
    labels = trainer_target_labels()
    # run and node from the PodMonitor's own relabelings, the rest from the operator's rules.
    assert {"run", "node", "namespace", "pod", "job", "container", "endpoint", "instance"} <= labels
    assert not {label for label in labels if label.startswith("__")}


def test_every_figure_the_runs_are_judged_by_has_a_panel():
    """Step time, memory, learning rate, grad norm, tokens/s (per GPU), MFU, NVLink, EFA, checkpoint
    stall and write time: each metric behind them (named by the code that exports it) drives a panel
    with a title and a unit."""
    gauges = {key: name for key, (name, _) in TrainerCollector.JOB_GAUGES.items()}
    checkpoint = {key: name for key, (name, _) in TrainerCollector.CHECKPOINT_GAUGES.items()}
    wanted = {gauges[k] for k in ("step_time_s", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_gpu", "mfu")}
    wanted |= {checkpoint["stall_s"], checkpoint["write_s"]}
    wanted |= {f"{metric}_total" for _, metric, _ in EFA_COUNTERS}
    wanted |= {name for name in trainer_metric_names() if name.startswith("fsdp_peak_memory")}
    wanted |= {field for field in exporter_dcgm_fields() if "NVLINK" in field}
    assert len(wanted) == 13, wanted  # allocated and reserved memory, one NVLink field
    shown = {
        name
        for p in panels(load())
        if p["type"] != "row" and p["title"] and p["fieldConfig"]["defaults"]["unit"]
        for t in p["targets"]
        for name in metric_names(plain_promql(t["expr"]))
    }
    assert wanted - shown == set()


def mutated(tmp_path: Path, title: str, change) -> dict[str, Any]:
    """A copy of the dashboard, written and read back, with `change` applied to the panel `title`."""
    dash = copy.deepcopy(load())
    panel = next(p for p in panels(dash) if p["title"] == title)
    change(panel)
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(dash))
    return load(path)


def set_expr(expr: str):
    def change(panel: dict[str, Any]) -> None:
        panel["targets"][0]["expr"] = expr

    return change


@pytest.mark.parametrize(
    ("title", "change", "expected"),
    [
        # A misspelt trainer metric.
        (
            "Step time",
            set_expr('max by (run) (fsdp_step_time_secs{run=~"$run"})'),
            "panel 'Step time': fsdp_step_time_secs is exported by neither",
        ),
        # A real DCGM field that the exporter is not configured to collect.
        (
            "NVLink throughput",
            set_expr('avg by (node, gpu) (DCGM_FI_PROF_NVLINK_TX_BYTES{node=~"$node"})'),
            "panel 'NVLink throughput': DCGM_FI_PROF_NVLINK_TX_BYTES is exported by neither",
        ),
        # A label the PodMonitor's scrape does not set.
        (
            "Learning rate",
            set_expr('max by (run, pod_name) (fsdp_learning_rate{run=~"$run"})'),
            "panel 'Learning rate': label pod_name is not on the series",
        ),
        # The exporter's host label instead of the node the ServiceMonitor relabels.
        (
            "GPU temperature",
            set_expr('avg by (hostname, gpu) (DCGM_FI_DEV_GPU_TEMP{gpu=~"$gpu"})'),
            "panel 'GPU temperature': label hostname is not on the series",
        ),
        # No unit, and a unit Grafana does not know.
        (
            "Gradient norm",
            lambda p: p["fieldConfig"]["defaults"].pop("unit"),
            "panel 'Gradient norm': unit '' is not a Grafana unit id",
        ),
        (
            "Checkpoint: stall and write time",
            lambda p: p["fieldConfig"]["defaults"].update(unit="seconds"),
            "panel 'Checkpoint: stall and write time': unit 'seconds' is not a Grafana unit id",
        ),
        ("EFA throughput", lambda p: p.update(title=""), "panel 15: no title"),
    ],
)
def test_a_broken_panel_is_reported(tmp_path, title, change, expected):
    found = problems(mutated(tmp_path, title, change))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_a_panel_moved_onto_another_is_reported(tmp_path):
    dash = mutated(tmp_path, "Step time", lambda p: p["gridPos"].update(x=0))
    assert overlaps(dash) == [("Tokens per second per GPU", "Step time")]


def test_the_dashboard_file_is_the_one_kustomize_packs():
    kustomization = yaml.safe_load(CONFIGS_KUSTOMIZATION.read_text())
    files = [f for gen in kustomization["configMapGenerator"] for f in gen["files"]]
    assert [REPO_ROOT / "base" / "monitoring" / "configs" / f for f in files] == [DASHBOARD]


# A real Prometheus scraping the trainer's real collector.

RECORD = {
    "step": 40,
    "total_steps": 1000,
    "data_epoch": 1,
    "loss": 2.5,
    "lr": 3e-4,
    "grad_norm": 1.25,
    "tokens_per_s": 16000.0,
    "tokens_per_s_per_gpu": 2000.0,
    "mfu": 0.41,
    "step_time_s": 2.0,
    "padding_fraction": 0.02,
    "world_size": 8,
    "peak_mem_gib": 60.0,
    "peak_mem_reserved_gib": 70.0,
}


@pytest.mark.cluster
def test_trainer_panels_and_the_hang_alert_on_a_real_prometheus(tmp_path):
    """Two runs' rank-0 endpoints (the trainer's PrometheusExporter, each with an EFA port whose byte
    counters grow), scraped with the labels the PodMonitor gives a pod: every dashboard query over
    trainer series returns both runs (or both nodes), and FsdpTrainingHung fires for the run whose
    deadline has passed only."""
    runs = {"r1": time.time() - 600, "r2": time.time() + 600}  # r1 past its deadline
    exporters, counters = {}, {}
    try:
        for i, (run, deadline) in enumerate(runs.items()):
            port = free_port()
            exporter = PrometheusExporter(port, {"model": "tiny"}, job_wide=True, node_ranks=8)
            exporters[run] = (exporter, port)
            counters[run] = tmp_path / f"sysfs-{run}" / "rdmap0s0" / "ports" / "1" / "hw_counters"
            counters[run].mkdir(parents=True)
            exporter.collector.infiniband = counters[run].parents[3]
            exporter.collector.deadline = deadline
            exporter.collector.checkpoint = {"step": 20, "stall_s": 1.5 + i, "write_s": 30.0 + i}
            exporter.update(RECORD, 1000)
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(short_for(yaml.safe_load(RULES.read_text())["spec"])))
        targets = [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {"namespace": "fsdp", "pod": f"{run}-worker-0", "node": f"n{i}", "run": run},
            }
            for i, (run, (_, port)) in enumerate(exporters.items())
        ]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "800ms", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{"job_name": "fsdp-trainer", "static_configs": targets}],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
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
        try:
            api = PrometheusAPI(prom_port)
            wait_until("Prometheus ready", api.ready, 60, (prometheus,))

            def efa_moves() -> bool:
                for n, folder in enumerate(counters.values()):
                    for name, _, _ in EFA_COUNTERS:
                        (folder / name).write_text(f"{int(time.time() * 1e9) * (n + 1)}\n")
                return len(api.query("rate(fsdp_efa_transmit_bytes_total[1m]) > 0")) == 2

            wait_until("two EFA counters that grow", efa_moves, 60, (prometheus,))
            hung = wait_until("FsdpTrainingHung firing", lambda: api.firing("FsdpTrainingHung"), 60, (prometheus,))
            assert [(a["labels"]["run"], a["labels"]["pod"], a["labels"]["job"]) for a in hung] == [
                ("r1", "r1-worker-0", "fsdp-trainer")
            ]
            assert hung[0]["annotations"]["summary"].startswith("Run fsdp/r1 is hung: 10m ")
            assert "SIGUSR1 dump in the log of pod r1-worker-0" in hung[0]["annotations"]["summary"]

            trainer = trainer_metric_names()
            checked = 0
            for where, expr in expressions(load()):
                if not metric_names(expr) & trainer or where.startswith("variable"):
                    continue
                result = api.query(expr)
                assert result, f"{where}: {expr} returns nothing"
                grouped = re.findall(r"\bby \(([^)]*)\)", expr)
                key = "node" if grouped and grouped[0] == "node" else "run"
                want = {"n0", "n1"} if key == "node" else set(runs)
                assert {r["metric"].get(key) for r in result} == want, (where, expr, result)
                assert all(float(r["value"][1]) > 0 for r in result), (where, expr, result)
                checked += 1
            assert checked >= 16  # every trainer target of the dashboard, the progress table's included
        finally:
            prometheus.kill()
            prometheus.wait(timeout=30)
    finally:
        for exporter, _ in exporters.values():
            exporter.close()
