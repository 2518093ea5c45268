"""The guards of trainer.launch, with real processes: the retry bound (attempts counted on the shared
volume), the Capacity Block stop (a real checkpoint, then exit 1) and the per-run transport check (on the
recorded NCCL logs of tests/data/nccl, written by stand-in workers where NCCL would write them)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_support import LAUNCH_TIMEOUT_S, REPO_ROOT, TINY, free_port, kill_processes_under, trainer_env

from trainer import attempts, capacity_block, transport_check

NCCL = REPO_ROOT / "tests" / "data" / "nccl"
# A worker that writes a recorded NCCL log where NCCL_DEBUG_FILE says (%h host, %p pid), then lives on.
FAKE_NCCL_WORKER = (
    'f=$(printf %s "$NCCL_DEBUG_FILE" | sed "s/%h/$(hostname)/; s/%p/$$/"); '
    '[ -n "$NCCL_DEBUG_FILE" ] && cat "$SRC" > "$f"; '
    'echo "worker NCCL_DEBUG_FILE=[$NCCL_DEBUG_FILE]"; exec sleep "$LIVE_S"'
)


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(tmp_path):
    yield
    kill_processes_under(tmp_path)


def launch(
    torchrun_args: list[str], *, timeout: float = LAUNCH_TIMEOUT_S, cwd: Path = REPO_ROOT, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.launch", *torchrun_args],
        cwd=cwd,
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


NO_OP = ["--standalone", "--nproc_per_node=1", "--no-python", "true"]


# Retry bound ------------------------------------------------------------------------------------------


def test_concurrent_starts_never_share_an_attempt_number(tmp_path):
    code = (
        "import sys; from pathlib import Path; from trainer.attempts import record_attempt; "
        "print(' '.join(str(record_attempt(Path(sys.argv[1]), 'run-worker-0')) for _ in range(5)))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], cwd=REPO_ROOT, env=trainer_env(), stdout=subprocess.PIPE
        )
        for _ in range(8)
    ]
    numbers = [int(n) for p in procs for n in p.communicate(timeout=60)[0].split()]
    assert sorted(numbers) == list(range(1, 41))
    assert attempts.record_attempt(tmp_path, "run-worker-1") == 1  # another replica counts on its own


@pytest.mark.slow
def test_the_start_after_the_configured_restarts_exits_1_with_one_line(tmp_path):
    env = {attempts.DIR_ENV: str(tmp_path / "runs" / "r1" / "attempts"), attempts.MAX_ENV: "2"}
    for i in range(3):  # the first start and two restarts
        done = launch(NO_OP, **env, FSDP_POD_NAME="r1-worker-0")
        assert done.returncode == 0, done.stderr
        assert (f"restart {i} of at most 2" in done.stderr) == (i > 0)
    done = launch(NO_OP, **env, FSDP_POD_NAME="r1-worker-0")
    assert done.returncode == 1 and len(errors(done.stderr)) == 1, done.stderr
    assert "r1-worker-0 started 4 times, more than 2 restarts (FSDP_MAX_RETRIES)" in errors(done.stderr)[0]
    assert "Traceback" not in done.stderr
    # Another replica of the job, and a new run (a new name, so a new folder), start at zero.
    assert launch(NO_OP, **env, FSDP_POD_NAME="r1-worker-1").returncode == 0
    other = {**env, attempts.DIR_ENV: str(tmp_path / "runs" / "r2" / "attempts")}
    assert launch(NO_OP, **other, FSDP_POD_NAME="r2-worker-0").returncode == 0


def test_a_bad_retry_bound_is_one_line_exit_2(tmp_path):
    done = launch(NO_OP, **{attempts.DIR_ENV: str(tmp_path), attempts.MAX_ENV: "ten"})
    assert done.returncode == 2 and len(errors(done.stderr)) == 1 and "FSDP_MAX_RETRIES='ten'" in done.stderr


# Capacity Block ---------------------------------------------------------------------------------------


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def block_end_in(seconds: float, grace_s: float) -> str:
    """An end time whose stop time (end - AWS's 30 minutes - grace - margin) is `seconds` from now."""
    return iso(time.time() + capacity_block.TERMINATION_LEAD_S + capacity_block.MARGIN_S + grace_s + seconds)


@pytest.mark.slow
def test_before_the_block_ends_the_run_checkpoints_and_exits_1(tmp_path):
    block = tmp_path / "capacity-block" / "end"
    block.parent.mkdir()
    block.write_text(block_end_in(3600, 30) + "\n")  # far off while the run starts
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics" / "metrics.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "trainer.train",
            "--config",
            str(TINY),
            "training.max_steps=100000",
            "checkpoint.interval_steps=0",
            f"checkpoint.dir={ckpt}",
            "checkpoint.export_dir=",
            f"metrics.output_dir={metrics.parent}",
        ],
        cwd=REPO_ROOT,
        env=trainer_env(FSDP_CAPACITY_BLOCK_FILE=str(block), FSDP_CAPACITY_BLOCK_POLL_S="0.5", FSDP_TERM_GRACE_S="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    # Training: the block's end is now near (as when the cluster's ConfigMap is set to a closer end).
    block.write_text(block_end_in(1, 30) + "\n")
    _, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 1, err[-4000:]
    (line,) = errors(err)
    assert "the Capacity Block ends at" in line and "with a checkpoint" in line and "bump the run's retry" in line
    # The checkpoint the SIGTERM wrote (no interval checkpoints: interval_steps=0).
    assert list(ckpt.glob("step-*/COMPLETE")), err[-4000:]


def test_a_run_that_starts_after_its_stop_time_exits_1_at_once_and_a_bad_end_is_exit_2(tmp_path):
    block = tmp_path / "end"
    block.write_text(block_end_in(-60, 30))
    done = launch(NO_OP, FSDP_CAPACITY_BLOCK_FILE=str(block), FSDP_TERM_GRACE_S="30")
    assert done.returncode == 1 and errors(done.stderr)[0].startswith("error: not starting: the Capacity Block")
    block.write_text("2026-12-10 11:30")  # no zone
    done = launch(NO_OP, FSDP_CAPACITY_BLOCK_FILE=str(block))
    assert done.returncode == 2 and "has no time zone" in done.stderr
    # An empty file (a cluster without a block) and a missing one (the ConfigMap is optional) stop nothing.
    block.write_text("")
    assert launch(NO_OP, FSDP_CAPACITY_BLOCK_FILE=str(block)).returncode == 0
    assert launch(NO_OP, FSDP_CAPACITY_BLOCK_FILE=str(tmp_path / "absent")).returncode == 0


def test_a_later_end_written_while_running_moves_the_stop(tmp_path):
    block = tmp_path / "end"
    block.write_text(block_end_in(3, 30))
    watch = capacity_block.BlockWatch(str(block), grace_s=30, poll_s=0.2)
    watch.check_at_start()
    old_stop = capacity_block.stop_time(watch.end, 30)
    reasons: list[str] = []
    watch.start(reasons.append)
    block.write_text(block_end_in(3600, 30))  # the block was extended
    extended = watch.read()
    deadline = time.monotonic() + 30
    # The watch reads the new end, then the old stop time passes with two more of its polls: no stop.
    while watch.end != extended or time.time() < old_stop + 2 * watch.poll_s:
        assert reasons == [], reasons
        assert time.monotonic() < deadline, f"the watch still has end {watch.end}, not the extended {extended}"
        time.sleep(0.05)
    watch.close()
    assert reasons == []


# Transport check --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("log", "transport"),
    [("efa-p5.log", "efa"), ("socket-fallback.log", "socket"), ("socket-h200x1-recorded.log", "socket")],
)
def test_the_watch_reads_the_transport_from_the_recorded_logs(tmp_path, log, transport):
    watch = transport_check.TransportWatch("efa", "fail", tmp_path, "WARN")
    assert watch.poll() is None
    text = (NCCL / log).read_text()
    half = len(text) // 2
    (tmp_path / "nccl.host.1").write_text(text[:half])  # NCCL still writing: a line may be cut
    watch.poll()
    with (tmp_path / "nccl.host.1").open("a") as fh:
        fh.write(text[half:])
    assert watch.poll() == transport
    assert bool(watch.mismatch()) == (transport != "efa")


def test_the_check_applies_to_multi_node_jobs_only_and_sets_ncclss_log_files():
    env = {transport_check.EXPECT_ENV: "efa", "NCCL_DEBUG": "WARN"}
    assert transport_check.TransportWatch.from_env(1, dict(env)) is None
    assert transport_check.TransportWatch.from_env(2, {**env, transport_check.MODE_ENV: "off"}) is None
    assert transport_check.TransportWatch.from_env(2, {"NCCL_DEBUG": "WARN"}) is None
    watched = dict(env)
    watch = transport_check.TransportWatch.from_env(2, watched)
    assert watch is not None and watch.mode == "fail"
    assert watched["NCCL_DEBUG"] == "INFO" and watched["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert watched["NCCL_DEBUG_FILE"] == str(watch.folder / "nccl.%h.%p")


def two_node_job(tmp_path: Path, log: str, live_s: int, **env: str) -> list[subprocess.CompletedProcess]:
    """Two agents of one c10d job on this host, each with one stand-in worker that writes `log`."""
    port = free_port()
    procs = []
    for i in (0, 1):
        args = [
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=transport-test",
            f"--rdzv-conf=is_host={str(i == 0).lower()}",
            "--no-python",
            "sh",
            "-c",
            FAKE_NCCL_WORKER,
        ]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "trainer.launch", *args],
                cwd=tmp_path,
                env=trainer_env(SRC=str(NCCL / log), LIVE_S=str(live_s), NCCL_DEBUG="WARN", **env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    done = []
    for p in procs:
        out, err = p.communicate(timeout=LAUNCH_TIMEOUT_S)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.slow
def test_a_multi_node_run_on_sockets_while_efa_was_expected_fails_fast_in_one_line(tmp_path):
    start = time.monotonic()
    # The workers would live 120 s: the check must end them long before.
    for done in two_node_job(tmp_path, "socket-fallback.log", 120, FSDP_EXPECT_TRANSPORT="efa"):
        assert done.returncode == 1, done.stderr[-3000:]
        (line,) = errors(done.stderr)
        assert "NCCL uses the socket transport between nodes, expected efa" in line
    assert time.monotonic() - start < 90


@pytest.mark.slow
def test_warn_mode_trains_on_and_efa_passes_with_the_warn_lines_shown(tmp_path):
    for done in two_node_job(
        tmp_path, "socket-fallback.log", 6, FSDP_EXPECT_TRANSPORT="efa", FSDP_TRANSPORT_CHECK="warn"
    ):
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stderr.count("warning: NCCL uses the socket transport between nodes, expected efa") == 1
    efa_log = tmp_path / "efa-with-warn.log"
    efa_log.write_text((NCCL / "efa-p5.log").read_text() + "host:1:1 [0] NCCL WARN a warning the pod shows\n")
    port_runs = two_node_job(tmp_path, str(efa_log), 4, FSDP_EXPECT_TRANSPORT="efa")
    for done in port_runs:
        assert done.returncode == 0 and not errors(done.stderr), done.stderr[-3000:]
        assert "NCCL WARN a warning the pod shows" in done.stderr  # WARN lines still reach the pod's log
        assert "NCCL INFO" not in done.stderr + done.stdout  # INFO stays in the files


@pytest.mark.slow
def test_a_single_node_run_is_not_checked(tmp_path):
    done = launch(
        ["--standalone", "--nproc_per_node=1", "--no-python", "sh", "-c", FAKE_NCCL_WORKER],
        cwd=tmp_path,
        FSDP_EXPECT_TRANSPORT="efa",
        SRC=str(NCCL / "socket-fallback.log"),
        LIVE_S="1",
    )
    assert done.returncode == 0, done.stderr
    assert "worker NCCL_DEBUG_FILE=[]" in done.stdout + done.stderr


def test_efa_p5_log_names_no_warning_yet():
    # The recorded logs hold INFO lines only: the WARN forwarding test adds its own line.
    assert "NCCL WARN" not in (NCCL / "efa-p5.log").read_text()
    assert os.path.isfile(NCCL / "socket-fallback.log")


# Pre-flight verdict --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_preflight_check_that_ran_and_failed_exits_3_through_launch_and_a_pass_0(tmp_path):
    """The pre-flight Job's podFailurePolicy fails the Job at once on 3 and retries anything else."""
    check = ["--standalone", "--nproc_per_node=2", "-m", "trainer.preflight", "--size-mib", "1", "--iters", "2"]
    assert launch(check).returncode == 0
    failed = launch([*check, "--expect-transport", "efa"])
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert '"passed": false' in failed.stdout and "Traceback" not in failed.stderr
