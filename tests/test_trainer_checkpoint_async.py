"""Asynchronous checkpoints under faults: 2 ranks on CPU through real torchrun (gloo), the tiny config.

A save in flight is made deterministic with the checkpointer's test hook (FSDP_CHECKPOINT_TEST_HOOK,
trainer/checkpoint.py): a file hold-step-N stops the background write of step N after its shards
are written and before COMPLETE, each rank says so with a file held-step-N-rank-R, and the write
goes on when the test removes the hold file. Every rank also logs its save events (stage, staged,
written, complete, removed) in order, which the tests read back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import (
    LAUNCH_TIMEOUT_S,
    finish,
    output_overrides,
    read_metrics,
    torchrun_cmd,
    trainer_env,
    wait_for,
    worker_pids,
)

from trainer.checkpoint import TEST_HOOK_ENV, complete_checkpoints, verify

pytestmark = pytest.mark.slow


def launch(tmp_path: Path, overrides: list[str], hook: Path | None = None) -> subprocess.Popen:
    """torchrun through trainer.launch, as in the cluster's pods (it exits 143 after SIGTERM)."""
    extra = {TEST_HOOK_ENV: str(hook)} if hook else {}
    cmd = torchrun_cmd([*output_overrides(tmp_path), *overrides])
    cmd[cmd.index("torch.distributed.run")] = "trainer.launch"
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def events(hook: Path, rank: int) -> list[tuple[str, int]]:
    lines = (hook / f"events-rank{rank}.jsonl").read_text().splitlines()
    return [(e["event"], e["step"]) for e in map(json.loads, lines)]


def hold(hook: Path, step: int) -> Path:
    hook.mkdir(exist_ok=True)
    path = hook / f"hold-step-{step}"
    path.touch()
    return path


def wait_held(hook: Path, step: int, proc: subprocess.Popen) -> None:
    held = [hook / f"held-step-{step}-rank-{rank}" for rank in (0, 1)]
    wait_for(lambda: all(p.exists() for p in held), proc, LAUNCH_TIMEOUT_S, f"both ranks holding step {step}")


def logged_steps(tmp_path: Path) -> list[int]:
    path = tmp_path / "metrics" / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.is_file() else []


def before(sequence: list[tuple[str, int]], first: tuple[str, int], second: tuple[str, int]) -> bool:
    return first in sequence and second in sequence and sequence.index(first) < sequence.index(second)


def test_a_save_in_flight_finishes_before_the_next_save_and_before_a_normal_exit(tmp_path):
    hook = tmp_path / "hook"
    release = hold(hook, 2)
    proc = launch(tmp_path, ["training.max_steps=5", "checkpoint.interval_steps=2", "checkpoint.keep_last=1"], hook)
    wait_held(hook, 2, proc)
    # Training goes on while step 2 is being written: step 3 is logged with that save still in flight.
    wait_for(lambda: 3 in logged_steps(tmp_path), proc, LAUNCH_TIMEOUT_S, "step 3 during the save of step 2")
    ckpt = tmp_path / "ckpt"
    assert (ckpt / ".tmp-step-00000002").is_dir() and not (ckpt / "step-00000002").exists()
    release.unlink()
    log = finish(proc)
    assert proc.returncode == 0, log[-4000:]
    for rank in (0, 1):
        seq = events(hook, rank)
        # Each save starts only after the previous one is complete, and the last one completes
        # before the process ends (nothing follows it).
        assert before(seq, ("complete", 2), ("stage", 4)), seq
        assert before(seq, ("complete", 4), ("stage", 5)), seq
        assert seq[-1][1] == 5 and ("complete", 5) in seq, seq
    # keep_last=1: each older checkpoint is removed only once the newer one is complete.
    seq0 = events(hook, 0)
    assert before(seq0, ("complete", 4), ("removed", 4)) and before(seq0, ("complete", 5), ("removed", 5)), seq0
    assert [p.name for p in ckpt.iterdir()] == ["step-00000005"] and verify(str(ckpt / "step-00000005")) is None
    assert "step-00000002 complete" in log and "Traceback" not in log


def test_the_synchronous_path_stays_available(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    proc = launch(
        tmp_path,
        [
            "training.max_steps=4",
            "checkpoint.interval_steps=2",
            "checkpoint.async_mode=disabled",
            "checkpoint.writer_threads=3",
        ],
        hook,
    )
    log = finish(proc)
    assert proc.returncode == 0, log[-4000:]
    seq = events(hook, 0)
    assert [e for e in seq if e[0] != "removed"] == [
        ("stage", 2),
        ("written", 2),
        ("complete", 2),
        ("stage", 4),
        ("written", 4),
        ("complete", 4),
    ]
    assert "staged in" not in log and [step for step, _ in complete_checkpoints(str(tmp_path / "ckpt"))] == [2, 4]


def test_sigterm_waits_for_the_save_in_flight_then_saves_and_exits_143(tmp_path):
    hook = tmp_path / "hook"
    release = hold(hook, 2)
    proc = launch(tmp_path, ["training.max_steps=400", "checkpoint.interval_steps=2", "checkpoint.keep_last=2"], hook)
    wait_held(hook, 2, proc)
    os.kill(proc.pid, signal.SIGTERM)  # what the kubelet does to the container's first process
    wait_for(
        lambda: all(("sigterm", 0) in events(hook, rank) for rank in (0, 1)),
        proc,
        LAUNCH_TIMEOUT_S,
        "SIGTERM on both ranks",
    )
    release.unlink()
    log = finish(proc)
    assert proc.returncode == 143, log[-4000:]
    step = read_metrics(tmp_path)[-1]["step"]
    assert f"stopped by SIGTERM after step {step}" in log
    for rank in (0, 1):
        seq = events(hook, rank)
        signalled = next(i for i, e in enumerate(seq) if e[0] == "sigterm")
        # The save in flight when the signal came completed, then the stop's own save; then the exit.
        assert seq.index(("complete", 2)) > signalled, seq
        assert seq[-1] in (("complete", step), ("removed", step)), seq
    ckpt = tmp_path / "ckpt"
    assert verify(str(ckpt / f"step-{step:08d}")) is None
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]
    assert "Traceback" not in log


def test_killed_during_a_background_save_resumes_from_the_previous_complete_checkpoint(tmp_path):
    hook = tmp_path / "hook"
    release = hold(hook, 4)
    overrides = ["training.max_steps=8", "checkpoint.interval_steps=2", "checkpoint.keep_last=1"]
    proc = launch(tmp_path, overrides, hook)
    wait_held(hook, 4, proc)
    ckpt = tmp_path / "ckpt"
    # keep_last=1, and yet step 2 stays while step 4 is not complete.
    assert verify(str(ckpt / "step-00000002")) is None
    assert (ckpt / ".tmp-step-00000004" / ".metadata").is_file() and not (ckpt / "step-00000004").exists()
    for pid in worker_pids(proc.pid).values():
        os.kill(pid, signal.SIGKILL)
    log = finish(proc)
    assert proc.returncode != 0, log[-4000:]
    release.unlink()
    # A newer directory that never completed is no candidate either.
    (ckpt / "step-00000006").mkdir()
    (ckpt / "step-00000006" / "trainer_state.json").write_text("{}")

    relaunched = launch(tmp_path, overrides)
    log = finish(relaunched)
    assert relaunched.returncode == 0, log[-4000:]
    assert f"resumed from {ckpt / 'step-00000002'} at step 2" in log
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000008"]
    assert read_metrics(tmp_path)[-1]["step"] == 8
