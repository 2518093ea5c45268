"""The NCCL pre-flight program: transport detection on recorded NCCL logs, the pass/fail rule, and the
program itself under real torchrun (gloo on CPU): one JSON line from rank 0, exit 0 or 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import trainer_env

from trainer.preflight import bus_bandwidth, detect_transport, judge

LOGS = Path(__file__).resolve().parent / "data" / "nccl"


@pytest.mark.parametrize(
    "name, transport",
    [
        ("efa-p5.log", "efa"),  # aws-ofi-nccl: NET/OFI, Libfabric channels between nodes
        ("socket-fallback.log", "socket"),  # no plugin, no InfiniBand: TCP between nodes
        ("nvlink-h200x2.log", "nvlink"),  # recorded on two H200s of one host: P2P only
        ("socket-h200x1-recorded.log", "socket"),  # recorded on one H200 with NCCL_NET=Socket: no channels
    ],
)
def test_detect_transport_from_nccl_logs(name, transport):
    assert detect_transport((LOGS / name).read_text()) == transport


def test_the_recorded_socket_log_fails_a_run_that_expects_efa():
    # What trainer.preflight printed for that capture (its JSON line): failed on the transport.
    log = (LOGS / "socket-h200x1-recorded.log").read_text()
    passed, reason = judge(detect_transport(log), "efa", 500.0, 100.0)
    assert not passed and reason.startswith("transport socket, expected efa")


def test_detect_transport_without_channel_lines_and_unknown():
    assert detect_transport("x [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.0\n") == "efa"
    assert detect_transport("x [0] NCCL INFO Using network IB\n") == "ib"
    assert detect_transport("x [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n") == "shm"
    assert detect_transport("") == "unknown"


def test_judge_and_bus_bandwidth():
    assert bus_bandwidth(100.0, 2) == 100.0 and bus_bandwidth(100.0, 16) == pytest.approx(187.5)
    assert judge("efa", "efa", 300.0, 100.0) == (True, "transport efa, bus bandwidth 300.0 GB/s")
    assert judge("socket", "any", 10.0, 0.0)[0]
    passed, reason = judge("socket", "efa", 10.0, 100.0)
    assert not passed and "transport socket, expected efa" in reason and "below the minimum 100.0" in reason


def preflight(*args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "trainer.preflight",
        "--size-mib",
        "1",
        "--iters",
        "3",
        *args,
    ]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=trainer_env(), capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_preflight_under_torchrun_passes_and_fails(tmp_path):
    ok = preflight("--json", str(tmp_path / "ok.json"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    lines = [json.loads(line) for line in ok.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, ok.stdout
    result = lines[0]
    assert list(result) == [
        "world_size",
        "size_mib",
        "algbw_gbs",
        "busbw_gbs",
        "transport",
        "expected",
        "min_busbw_gbs",
        "passed",
        "reason",
    ]
    assert result["world_size"] == 2 and result["transport"] == "gloo" and result["passed"] is True
    assert result["busbw_gbs"] == pytest.approx(result["algbw_gbs"], rel=1e-3) and result["algbw_gbs"] > 0
    assert json.loads((tmp_path / "ok.json").read_text()) == result
    bad = preflight("--expect-transport", "efa", "--min-busbw-gbs", "1e6")
    assert bad.returncode == 1
    result = json.loads(bad.stdout.strip().splitlines()[-1])
    assert result["passed"] is False and "expected efa" in result["reason"]
