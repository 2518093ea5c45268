"""The report over real trainer runs: the tiny model trained by torchrun on CPU with 1 and 2 ranks,
both run directories fed to the report CLI."""

from __future__ import annotations

import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import trainer_env

from generators.report import main
from generators.results.measurements import load, summarise

# Trains real runs through torchrun first.
pytestmark = pytest.mark.slow

STEPS = 6
WARMUP_LOGS = 3
TIMEOUT_S = 240


def torchrun(nproc: int, out: Path) -> subprocess.Popen:
    env = trainer_env()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "trainer.train",
        "--config",
        "trainer/configs/tiny.yaml",
        f"training.max_steps={STEPS}",
        f"checkpoint.dir={out / 'ckpt'}",
        f"metrics.output_dir={out / 'metrics'}",
        "checkpoint.export_dir=",
    ]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> list[Path]:
    """metrics.output_dir of a 1-rank and a 2-rank run (launched together to save wall time)."""
    root = tmp_path_factory.mktemp("report-runs")
    procs = {n: torchrun(n, root / f"g{n}") for n in (1, 2)}
    for n, proc in procs.items():
        try:
            output, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        assert proc.returncode == 0, f"{n} rank(s): exit {proc.returncode}\n{output[-4000:]}"
    return [root / "g1" / "metrics", root / "g2" / "metrics"]


def test_report_over_real_runs_shows_both_world_sizes_with_finite_efficiency(run_dirs, tmp_path, cli):
    out = tmp_path / "report"
    result = cli(main, [*map(str, run_dirs), "--out", str(out), "--warmup-logs", str(WARMUP_LOGS)])
    assert result.exit_code == 0, result.output
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in result.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("tiny FULL_SHARD", "1"), ("tiny FULL_SHARD", "2")]
    efficiencies = [float(r[5].rstrip("%")) for r in rows]
    assert efficiencies[0] == 100.0
    assert math.isfinite(efficiencies[1]) and efficiencies[1] > 0
    # the writer records what it owns beside the outputs, so a later report prunes only its own files
    assert sorted(p.name for p in out.iterdir()) == [".fsdp-gitops-report.files", "mfu.svg", "report.md", "scaling.svg"]
    polylines = ET.parse(out / "scaling.svg").getroot().findall(".//{http://www.w3.org/2000/svg}polyline")
    assert len(polylines) == 1 and len(polylines[0].get("points").split()) == 2


def test_figures_are_medians_of_the_logged_steps_after_warmup(run_dirs):
    measurements = load([str(d) for d in run_dirs], WARMUP_LOGS)
    assert [m.world_size for m in measurements] == [1, 2]
    for m in measurements:
        assert m.device == "cpu" and m.mfu == 0.0
        assert f"median of {STEPS - WARMUP_LOGS} logged steps" in m.note
    one, two = summarise(measurements)
    assert two.tokens_per_s == pytest.approx(2 * two.tokens_per_s_per_gpu)
    assert two.efficiency == pytest.approx(two.tokens_per_s_per_gpu / one.tokens_per_s_per_gpu)
    assert math.isfinite(two.efficiency) and two.efficiency > 0


def two_nodes_of_one(out: Path) -> list[subprocess.Popen]:
    """A 2-node x 1-process run on this machine: two torchrun agents meeting through a c10d store."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = trainer_env()
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=report-2x1",
            f"--rdzv-conf=is_host={str(node == 0).lower()}",
            "-m",
            "trainer.train",
            "--config",
            "trainer/configs/tiny.yaml",
            f"training.max_steps={STEPS}",
            f"checkpoint.dir={out / 'ckpt'}",
            f"metrics.output_dir={out / 'metrics'}",
            "checkpoint.export_dir=",
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    return procs


def test_one_node_of_two_and_two_nodes_of_one_are_separate_series(run_dirs, tmp_path, cli):
    two_by_one = tmp_path / "n2x1"
    for proc in two_nodes_of_one(two_by_one):
        output, _ = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0, output[-4000:]
    out = tmp_path / "report"
    inputs = [*map(str, run_dirs), str(two_by_one / "metrics")]
    result = cli(main, [*inputs, "--out", str(out), "--warmup-logs", str(WARMUP_LOGS)])
    assert result.exit_code == 0, result.output
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in result.stdout.splitlines()[2:]]
    assert sorted((r[0], r[1]) for r in rows) == [
        ("tiny FULL_SHARD, 1 GPU per node", "1"),  # 1 x 1
        ("tiny FULL_SHARD, 1 GPU per node", "2"),  # 2 nodes x 1
        ("tiny FULL_SHARD, 2 GPUs per node", "2"),  # 1 node x 2
    ]
    # The chart draws them apart too: a line of two points and one point, each in the legend.
    svg = ET.parse(out / "scaling.svg").getroot()
    texts = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"tiny FULL_SHARD, 1 GPU per node", "tiny FULL_SHARD, 2 GPUs per node"} <= texts, texts
