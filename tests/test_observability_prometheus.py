"""A real Prometheus scrapes a real 2-node CPU trainer run and evaluates the project's alert rules.

Two torchrun agents on loopback form one job of two "nodes" (one rank each, c10d rendezvous), as two
pods of a PyTorchJob would; each serves its own /metrics port. Prometheus (the pinned build from
tools/cluster/prometheus, temporary TSDB, 1 s scrape and rule intervals) scrapes both with the labels
the PodMonitor gives real pods (job, namespace, pod, node, run) and loads
base/monitoring/configs/prometheusrule-fsdp.yaml with every `for:` shortened to 2 s (the rules are
otherwise unchanged). The test then reads everything back through Prometheus' HTTP API.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from observability_support import RULES, PrometheusAPI, short_for, wait_until
from support import REPO_ROOT
from trainer_support import TINY, free_port, output_overrides, read_metrics, trainer_env, worker_pids

from tools.cluster.build import binary

RUN = "tiny-observed"
NAMESPACE = "fsdp"


def start_node(out: Path, rdzv_port: int, metrics_port: int, log: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{rdzv_port}",
        f"--rdzv-id={RUN}",
        "-m",
        "trainer.train",
        "--config",
        str(TINY),
        *output_overrides(out),
        "training.max_steps=100000",
        "checkpoint.interval_steps=100000",
        f"metrics.prometheus_port={metrics_port}",
    ]
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=trainer_env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    """Kill a torchrun agent and its workers (torchrun starts each worker in a session of its own)."""
    for pid in worker_pids(proc.pid).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.cluster
def test_prometheus_scrapes_the_run_sums_pods_and_alerts_on_a_paused_trainer(tmp_path):
    prom_port, rdzv_port = free_port(), free_port()
    metrics_ports = [free_port(), free_port()]
    pods = [f"{RUN}-worker-{i}" for i in range(2)]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(short_for(yaml.safe_load(RULES.read_text())["spec"])))
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "800ms", "evaluation_interval": "1s"},
                "rule_files": ["rules.yaml"],
                "scrape_configs": [
                    {
                        "job_name": "fsdp-trainer",
                        # What the PodMonitor's relabelling gives a real pod (job from jobLabel, run, node).
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{port}"],
                                "labels": {"namespace": NAMESPACE, "pod": pod, "node": f"node-{i}", "run": RUN},
                            }
                            for i, (pod, port) in enumerate(zip(pods, metrics_ports, strict=True))
                        ],
                    }
                ],
            }
        )
    )
    prom_log = tmp_path / "prometheus.log"
    prometheus = subprocess.Popen(
        [
            str(binary("prometheus")),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        cwd=tmp_path,
        stdout=prom_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    nodes: list[subprocess.Popen] = []
    try:
        api = PrometheusAPI(prom_port)
        wait_until("Prometheus ready", api.ready, 60, (prometheus,))
        assert {r["name"] for g in api.get("rules")["groups"] for r in g["rules"]} >= {
            "FsdpTrainerMetricsMissing",
            "FsdpThroughputDrop",
            "fsdp:tokens_per_second:sum",
        }
        out = tmp_path / "run"
        nodes = [start_node(out, rdzv_port, port, tmp_path / f"node{i}.log") for i, port in enumerate(metrics_ports)]

        # The run's throughput series, with the run's labels, from exactly one of its two pods.
        series = wait_until(
            "a tokens/s series", lambda: api.query(f'fsdp_tokens_per_second{{run="{RUN}"}}'), procs=(prometheus, *nodes)
        )
        assert len(series) == 1
        labels = series[0]["metric"]
        assert labels["job"] == "fsdp-trainer" and labels["namespace"] == NAMESPACE and labels["pod"] in pods
        wait_until("both pods up", lambda: len(api.query(f'up{{run="{RUN}"}} == 1')) == 2, procs=nodes)
        assert not api.query('{__name__=~"fsdp_.*_created"}')  # no stray _created series
        per_node = api.query(f'fsdp_node_ranks{{run="{RUN}"}}')
        assert sorted(r["metric"]["pod"] for r in per_node) == pods  # every pod answers, with its own figures

        # Sums over pods equal the job's own figures in metrics.jsonl, at every scraped step.
        wait_until(
            "10 s of scrapes past step 20",
            lambda: api.query(
                f'count_over_time(fsdp_step{{run="{RUN}"}}[30s]) >= 10 and fsdp_step{{run="{RUN}"}} >= 20'
            ),
            procs=nodes,
        )
        end = time.time()
        window = {"start": end - 10, "end": end, "step": 1}

        def values(expr: str) -> dict[float, float]:
            (result,) = api.get("query_range", query=expr, **window)["result"]
            return {t: float(v) for t, v in result["values"]}

        steps = values(f'sum by (run) (fsdp_step{{run="{RUN}"}})')
        tokens = values(f'sum by (run) (fsdp_tokens_total{{run="{RUN}"}})')
        rates = values(f'sum by (run) (fsdp_tokens_per_second{{run="{RUN}"}})')
        recorded = values(f'fsdp:tokens_per_second:sum{{run="{RUN}"}}')
        records = {r["step"]: r for r in read_metrics(out)}
        assert len(steps) >= 8 and steps.keys() == tokens.keys() == rates.keys()
        for t, step in steps.items():
            record = records[int(step)]
            assert tokens[t] == record["tokens"], (step, tokens[t], record["tokens"])
            assert rates[t] == pytest.approx(record["tokens_per_s"], rel=1e-9)
        # The recording rule the throughput alert uses: each value is one step's job throughput.
        logged = [r["tokens_per_s"] for r in records.values()]
        assert len(recorded) >= 5
        assert all(any(v == pytest.approx(x, rel=1e-9) for x in logged) for v in recorded.values()), recorded

        # Paused (SIGSTOP on every rank): the endpoints stop answering and the alert fires; resumed, it clears.
        assert not api.firing("FsdpTrainerMetricsMissing")
        workers = [pid for node in nodes for pid in worker_pids(node.pid).values()]
        assert len(workers) == 2
        step_before = float(api.query(f'fsdp_step{{run="{RUN}"}}')[0]["value"][1])
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            alerts = wait_until("FsdpTrainerMetricsMissing firing", lambda: api.firing("FsdpTrainerMetricsMissing"), 60)
            assert {a["labels"]["pod"] for a in alerts} <= set(pods)
            assert all(a["labels"]["run"] == RUN for a in alerts)
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        wait_until("the alert to clear", lambda: not api.firing("FsdpTrainerMetricsMissing"), 60, nodes)
        wait_until("training to go on", lambda: api.query(f'fsdp_step{{run="{RUN}"}} > {step_before}'), 60, nodes)
    finally:
        for node in nodes:
            stop(node)
        prometheus.terminate()
        try:
            prometheus.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()
    assert prometheus.returncode == 0, prom_log.read_text()[-3000:]
