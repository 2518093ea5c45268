"""trainer.launch's hang watch (trainer/watchdog.py): a run that stops making progress is stopped with
every rank's stack and a restartable exit, and a healthy one, checkpoints included, is left alone.

The hang is real: tests/trainer_hang.py is the trainer with one rank that stops before a step, so the
other rank blocks inside the step's first collective (gloo, two CPU ranks under real torchrun). The bounds are
shrunk through the same environment variables a run sets.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import REPO_ROOT
from trainer_support import LAUNCH_TIMEOUT_S, TINY, kill_processes_under, read_metrics, trainer_env

from trainer import launch, watchdog
from trainer.metrics import TrainerCollector

HANG = REPO_ROOT / "tests" / "trainer_hang.py"
# Seconds: a step of the tiny model on CPU takes well under one; loading it a few.
FAST_BOUNDS = {
    "FSDP_HANG_MIN_S": "4",
    "FSDP_HANG_FACTOR": "10",
    "FSDP_HANG_FIRST_STEP_S": "120",
    "FSDP_HANG_CHECKPOINT_S": "120",
    "FSDP_HANG_POLL_S": "0.5",
    "FSDP_HANG_DUMP_WAIT_S": "3",
}


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test(tmp_path):
    yield
    kill_processes_under(tmp_path)


def launch_tiny(tmp_path: Path, script: list[str], overrides: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--standalone",
            "--nproc_per_node=2",
            *script,
            "--config",
            str(TINY),
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            "checkpoint.export_dir=",
            f"metrics.output_dir={tmp_path / 'metrics'}",
            *overrides,
        ],
        cwd=REPO_ROOT,
        env=trainer_env(**FAST_BOUNDS, **env),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )


# Bounds and heartbeats, in this process.


def test_the_bound_follows_the_phase_and_the_measured_step_time():
    bounds = watchdog.HangBounds(factor=10, min_s=5, first_step_s=300, checkpoint_s=120)
    assert bounds.bound_s("start", None) == 300
    assert bounds.bound_s("step", None) == 300  # one step done: no step time measured yet
    assert bounds.bound_s("step", 0.1) == 5  # the floor
    assert bounds.bound_s("step", 2.0) == 20
    assert bounds.bound_s("checkpoint", 2.0) == bounds.bound_s("end", 2.0) == 120


def test_heartbeats_measure_steps_but_not_checkpoints(tmp_path):
    bounds = watchdog.HangBounds(factor=10, min_s=0.001, first_step_s=300, checkpoint_s=120)
    beat = watchdog.Heartbeat(bounds, rank=3, folder=str(tmp_path))
    assert json.loads((tmp_path / "rank-3").read_text())["phase"] == "start"
    beat.beat("step", 1)
    assert beat.step_time_s is None and beat.deadline - time.time() > 250
    time.sleep(0.05)
    beat.beat("step", 2)
    assert 0.04 < beat.step_time_s < 1.0
    measured = beat.step_time_s
    beat.beat("checkpoint")
    assert 100 < beat.deadline - time.time() <= 120
    time.sleep(0.3)  # a save: not a step time
    beat.beat("step", 3)
    assert beat.step_time_s == measured
    written = json.loads((tmp_path / "rank-3").read_text())
    assert written["step"] == 3 and written["phase"] == "step" and written["pid"] > 0
    assert watchdog.HangWatch(tmp_path).check(now=written["deadline"] + 1) == [
        {**written, "pid": written["pid"], "deadline": written["deadline"]}
    ]
    assert watchdog.HangWatch(tmp_path).check(now=written["deadline"] - 1) == []


def test_a_dead_workers_heartbeat_is_not_judged(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "rank-0").write_text(json.dumps({"pid": int(dead.stdout), "deadline": 1.0, "rank": 0}))
    (tmp_path / "rank-1").write_text("{half")
    assert watchdog.HangWatch(tmp_path).check() == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FSDP_HANG_MIN_S", "-1"),
        ("FSDP_HANG_FACTOR", "ten"),
        ("FSDP_HANG_WATCHDOG", "maybe"),
        ("FSDP_HANG_POLL_S", "0"),
    ],
)
def test_a_bad_setting_is_one_line_exit_2(name, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        watchdog.HangWatch.from_env({name: value})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {name}={value!r}")


def test_the_deadline_is_served_by_the_job_wide_pod_only():
    def scrape(job_wide: bool) -> str:
        collector = TrainerCollector({"model": "tiny"}, job_wide=job_wide, node_ranks=1)
        collector.deadline = 1234.5
        registry = CollectorRegistry()
        registry.register(collector)
        return generate_latest(registry).decode()

    assert "fsdp_progress_deadline_timestamp_seconds 1234.5" in scrape(True)
    assert "fsdp_progress_deadline_timestamp_seconds" not in scrape(False)


def test_hung_is_restartable_and_tells_itself_apart():
    assert watchdog.HUNG >= 128 and watchdog.HUNG not in (launch.STOPPED, launch.LOST_PEER, *launch.VERDICTS)
    assert watchdog.HUNG > 128 + 64  # never reads as a signal


# Real torchrun.


@pytest.mark.slow
def test_a_rank_blocked_in_a_collective_dumps_every_stack_and_exits_restartable(tmp_path):
    started = time.monotonic()
    done = launch_tiny(tmp_path, [str(HANG)], [], FSDP_TEST_HANG_AT_STEP="4", FSDP_TEST_HANG_RANK="1")
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == watchdog.HUNG, out[-4000:]
    # One line names the rank and the bound's phase, before the stacks.
    assert re.search(r"launch: rank \d made no progress for \d+ s in phase step after step 3", out), out[-4000:]
    assert "dumping the stacks of ranks 0, 1 (SIGUSR1)" in out
    # Both processes dumped all their threads: the sleeping rank in the test's step, the other one
    # inside the collective it waits in.
    assert "in hanging_step" in out, out[-6000:]
    # faulthandler heads the thread that took the signal "Current thread" only when it is a Python
    # thread; a signal that lands on a C++ thread (gloo's) heads every thread "Thread".
    assert len(re.findall(r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\)", out)) >= 2, out[-6000:]
    # The two processes write their dumps to one stream at once, so lines of one can cut into the
    # other's: the collective's frame is looked for by its parts.
    assert "distributed_c10d.py" in out, out[-6000:]
    assert re.search(r"all_reduce|all_gather_into_tensor|_all_gather_base", out), out[-6000:]
    assert "error: the run is hung: rank" in out and f"exit status {watchdog.HUNG}" in out
    assert "Traceback" not in out.split("error: the run is hung")[-1]
    # Steps 1-3 trained, then the bound of the measured step time (the 4 s floor) and the dump wait:
    # seconds, not the job's deadline.
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert took < 90, took


@pytest.mark.slow
def test_a_healthy_run_with_checkpoints_is_left_alone(tmp_path):
    # A checkpoint every 5 steps, a step bound of 4 s: the saves fall under the checkpoint bound, and
    # no step is mistaken for a hang.
    done = launch_tiny(tmp_path, ["-m", "trainer.train"], ["training.max_steps=12", "checkpoint.interval_steps=5"])
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "made no progress" not in out
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 13))
    assert (tmp_path / "ckpt" / "step-00000010" / "COMPLETE").exists()
