"""python -m trainer.launch: a rendezvous host that never resolves fails in one line, and a lost
worker 0 is a restartable exit while a bug in the trainer stays a permanent one.

The lost node is worker 0's torchrun and trainer killed with SIGKILL together. All nodes are real
torchrun agents (c10d) training the tiny config, one CPU rank each; the bug is tests/trainer_crash.py,
the trainer with a training step that raises. A host that appears late (real name resolution in a
mount namespace, as root): tests/cluster/test_trainer_launch_late_host.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import (
    LAUNCH_TIMEOUT_S,
    TINY,
    finish,
    free_port,
    kill_processes_under,
    trainer_env,
    wait_for_line,
    worker_pids,
)

from trainer.launch import LOST_PEER


@pytest.mark.slow
def test_a_host_that_never_resolves_fails_in_one_line_after_the_window(tmp_path):
    env = trainer_env(FSDP_RDZV_WAIT_S="2")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=fsdp-never.invalid:29400",
            "--rdzv-id=x",
            "-m",
            "trainer.train",
            "--config",
            str(TINY),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "fsdp-never.invalid did not resolve within 2 s" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_bad_wait_setting_is_one_line_exit_2():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--nnodes=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=somewhere:29400",
            "-m",
            "trainer.train",
            "--config",
            str(TINY),
        ],
        cwd=REPO_ROOT,
        env=trainer_env(FSDP_RDZV_WAIT_S="ten minutes"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: FSDP_RDZV_WAIT_S='ten minutes': must be a number of seconds, e.g. FSDP_RDZV_WAIT_S=900"
    ], done


@pytest.mark.slow
def test_sigterm_while_waiting_exits_143(tmp_path):
    # A pod deleted while its worker waits for the first one: a status the operator restarts, at once
    # (as a container's first process, an unhandled SIGTERM would be ignored until the grace period ends).
    log = tmp_path / "wait.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=fsdp-never.invalid:29400",
            "--rdzv-id=x",
            "-m",
            "trainer.train",
            "--config",
            str(TINY),
        ],
        cwd=REPO_ROOT,
        env=trainer_env(FSDP_RDZV_WAIT_S="300"),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_line(log, "waiting for fsdp-never.invalid to resolve", proc)
    proc.send_signal(signal.SIGTERM)
    finish(proc, 60)
    assert proc.returncode == 143, log.read_text()


# --- a lost peer: worker 0's node goes away (restartable) vs. a bug in the trainer (permanent) -------

CRASH = REPO_ROOT / "tests" / "trainer_crash.py"


@pytest.fixture(autouse=True)
def no_node_outlives_its_test(tmp_path):
    """Whatever a test ends with (a failed assertion included), its agents and trainer processes go."""
    yield
    kill_processes_under(tmp_path)


def c10d_node(
    out: Path,
    name: str,
    port: int,
    is_host: bool,
    torchrun_args: Sequence[str] = (),
    overrides: Sequence[str] = (),
    script: Sequence[str] = ("-m", "trainer.train"),
    **env: str,
) -> tuple[subprocess.Popen, Path]:
    """One pod of a 2-node job (one CPU rank) on a c10d rendezvous at 127.0.0.1; the host serves the store.

    With the pods' TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (base/pytorchjob), so that torchrun's restarts
    set up the process group again."""
    (out / name).mkdir(parents=True, exist_ok=True)
    log = out / name / "launch.log"  # a restart appends to it, as to the pod's logs
    cmd = [
        sys.executable,
        "-m",
        "trainer.launch",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=lost-peer-test",
        f"--rdzv-conf=is_host={str(is_host).lower()}",
        *torchrun_args,
        *script,
        "--config",
        str(TINY),
        f"checkpoint.dir={out / 'ckpt'}",
        "checkpoint.export_dir=",
        f"metrics.output_dir={out / name}",
        *overrides,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **env),
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log


def job(
    out: Path, torchrun_args: Sequence[str] = (), overrides: Sequence[str] = ()
) -> list[tuple[subprocess.Popen, Path]]:
    """Worker 0 (serves the store) and worker 1 of one job, with checkpoints in out/ckpt."""
    port = free_port()
    return [c10d_node(out, f"worker-{i}", port, i == 0, torchrun_args, overrides) for i in (0, 1)]


def lose_node(agent: subprocess.Popen) -> None:
    """SIGKILL a node's torchrun and its trainer processes together, as when the node goes away.

    torchrun starts every worker in a session of its own, so the agent's process group alone would
    leave the trainer running."""
    workers = worker_pids(agent.pid)
    assert workers, "no trainer process under the agent"
    for group in (agent.pid, *workers.values()):
        os.killpg(group, signal.SIGKILL)


def wait_for_checkpoint(ckpt: Path, nodes) -> None:
    for proc, log in nodes:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not any(ckpt.glob("step-*/COMPLETE")):
        for proc, log in nodes:
            assert proc.poll() is None, f"exited {proc.returncode} before a checkpoint:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)


def newest_checkpoint(ckpt: Path) -> Path:
    return max(p.parent for p in ckpt.glob("step-*/COMPLETE"))


def finish_log(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"not finished in {timeout}s:\n{log.read_text()[-4000:]}") from None
    return log.read_text()


@pytest.mark.slow
def test_losing_worker_0s_node_is_a_restartable_exit_and_the_restarted_job_resumes(tmp_path):
    # As the generated jobs run: --max-restarts=3, torchrun's own monitor interval.
    nodes = job(tmp_path, ["--max-restarts=3"], ["checkpoint.interval_steps=2"])
    (first, first_log), (second, second_log) = nodes
    wait_for_checkpoint(tmp_path / "ckpt", nodes)
    lose_node(first)
    lost = time.monotonic()
    log = finish_log(second, second_log, 90)
    assert second.returncode == LOST_PEER, f"exit {second.returncode}:\n{log[-4000:]}"
    assert time.monotonic() - lost < 60
    assert "the rendezvous store is gone" in log and f"a peer node was lost, exit status {LOST_PEER}" in log
    finish_log(first, first_log, 10)

    # The operator re-creates the pods: the job resumes from the newest complete checkpoint.
    ckpt = newest_checkpoint(tmp_path / "ckpt")
    step = int(ckpt.name.removeprefix("step-"))
    for name in ("worker-0", "worker-1"):
        (tmp_path / name / "metrics.jsonl").unlink(missing_ok=True)
    restarted = job(tmp_path, ["--max-restarts=3"], ["checkpoint.interval_steps=2", f"training.max_steps={step + 2}"])
    logs = [finish_log(proc, log, LAUNCH_TIMEOUT_S) for proc, log in restarted]
    assert [proc.returncode for proc, _ in restarted] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert any(f"resumed from {ckpt} at step {step}" in log for log in logs), "\n".join(logs)
    records = [
        json.loads(line)
        for path in tmp_path.glob("worker-*/metrics.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    assert [r["step"] for r in records] == [step + 1, step + 2]


@pytest.mark.slow
def test_workers_whose_collectives_broke_with_the_lost_node_are_restartable_too(tmp_path):
    # No restart left, and what torchrun sees first is its worker failing in a collective (gloo:
    # connection closed by peer), exit 1 like any trainer exception. Which torchrun meets first, its
    # worker's exit or its own store read at the next monitor tick, is a race on a loaded machine, so
    # the agent is stopped (SIGSTOP) in the sleep between two ticks until its worker can be reaped, and
    # only then continued. Stopped anywhere else in a tick, it would go on to that tick's store read.
    nodes = job(tmp_path, ["--max-restarts=0"], ["checkpoint.interval_steps=2"])
    (first, _), (second, second_log) = nodes
    wait_for_checkpoint(tmp_path / "ckpt", nodes)
    (worker,) = worker_pids(second.pid).values()
    stop_while_sleeping(second.pid)
    try:
        lose_node(first)
        deadline = time.monotonic() + 60
        while not exited(worker):
            assert time.monotonic() < deadline, "the surviving node's worker did not fail in its collective"
            time.sleep(0.05)
    finally:
        os.kill(second.pid, signal.SIGCONT)
    log = finish_log(second, second_log, 90)
    assert second.returncode == LOST_PEER, f"exit {second.returncode}:\n{log[-4000:]}"
    assert re.search(r"Connection (closed|reset) by peer", log), log[-3000:]
    assert re.search(r"launch: the workers failed \(rank \d exit 1\); the rendezvous store is gone", log), log[-3000:]


# The sleeps of Python's time.sleep (clock_nanosleep, nanosleep) by machine.
SLEEP_SYSCALLS = {"x86_64": {"230", "35"}, "aarch64": {"115", "101"}}


def stop_while_sleeping(pid: int, timeout: float = 60) -> None:
    """SIGSTOP process `pid` at a moment its main thread is in a sleep: a stopped task's
    /proc/PID/syscall names the system call it stopped in (-1 when it stopped running its own code)."""
    sleeps = SLEEP_SYSCALLS[os.uname().machine]
    deadline = time.monotonic() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        while proc_status(pid)["State"] != "T":
            time.sleep(0.001)
        if Path(f"/proc/{pid}/syscall").read_text().split()[0] in sleeps:
            return
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, f"process {pid} was never stopped in a sleep"
        time.sleep(0.037)


def exited(pid: int) -> bool:
    """Whether process `pid` has exited so that its parent's waitpid reaps it: gone, or a zombie with
    no thread left. The main thread of a process of many threads turns zombie first; until the last
    of its threads has exited (a loaded machine takes a while to tear the trainer down), waitpid still
    finds it running, and so does torchrun's poll."""
    try:
        status = proc_status(pid)
    except OSError:
        return True
    return status["State"] in ("Z", "X") and int(status.get("Threads", "1")) <= 1


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as {field: value}, State as its one letter (R, S, T, Z...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    fields["State"] = fields["State"].split()[0]
    return fields


@pytest.mark.slow
def test_an_exception_in_the_trainer_stays_a_permanent_exit_1(tmp_path):
    # One node, two ranks: rank 1 raises, rank 0 fails in the collective it broke (exit 1, as a worker
    # whose peer node went away). The store still answers, so it is the trainer's failure.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.launch",
            "--standalone",
            "--nproc_per_node=2",
            str(CRASH),
            "--config",
            str(TINY),
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            "checkpoint.export_dir=",
            f"metrics.output_dir={tmp_path / 'metrics'}",
        ],
        cwd=REPO_ROOT,
        env=trainer_env(FSDP_TEST_CRASH_AT_STEP="2", FSDP_TEST_CRASH_RANK="1"),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert "injected bug in the training step" in out and re.search(r"Connection (closed|reset) by peer", out)
    assert "a peer node was lost" not in out


@pytest.mark.slow
def test_an_exception_in_the_trainer_of_another_node_fails_the_job(tmp_path):
    # The trainer on worker 1 raises at every attempt, and torchrun restarts the workers once (the
    # generated jobs allow 3; one keeps the test short). Worker 0 serves the store, so it always
    # reaches it and ends with 1 (its workers failed, or worker 1 closed the rendezvous): under
    # restartPolicy ExitCode one permanent exit fails the job. Worker 1 ends with 1, or with 200 when
    # worker 0 was gone first.
    port = free_port()
    nodes = [
        c10d_node(tmp_path, "worker-0", port, True, ["--max-restarts=1"]),
        c10d_node(
            tmp_path, "worker-1", port, False, ["--max-restarts=1"], script=[str(CRASH)], FSDP_TEST_CRASH_AT_STEP="2"
        ),
    ]
    logs = [finish_log(proc, log, LAUNCH_TIMEOUT_S) for proc, log in nodes]
    codes = [proc.returncode for proc, _ in nodes]
    assert codes[0] == 1 and codes[1] in (1, LOST_PEER), f"{codes}:\n" + "\n".join(log[-3000:] for log in logs)
    assert "injected bug in the training step" in logs[1]
    assert "a peer node was lost" not in logs[0]


@pytest.mark.slow
def test_a_deleted_worker_0_is_recreated_and_the_job_resumes_from_its_sigterm_checkpoint(tmp_path):
    # A pod deletion: the kubelet sends SIGTERM to the launcher alone (the container's first process),
    # the workers checkpoint and the launcher exits 143; the operator re-creates worker 0's pod with the
    # same command. Worker 1, whose store went with worker 0, must rejoin the new one (or exit for a
    # restart of its own), and the job must finish from that checkpoint without losing a completed step.
    args = ["--max-restarts=3", "--rdzv-conf=join_timeout=1800"]
    overrides = ["checkpoint.interval_steps=1000", "training.max_steps=12"]
    port = free_port()
    (first, first_log), (second, second_log) = (
        c10d_node(tmp_path, f"worker-{i}", port, i == 0, args, overrides) for i in (0, 1)
    )
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while len(steps_logged(tmp_path)) < 3:
        assert first.poll() is None and second.poll() is None and time.monotonic() < deadline, first_log.read_text()
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    log = finish_log(first, first_log, 90)
    assert first.returncode == 143, log[-4000:]
    ckpt = newest_checkpoint(tmp_path / "ckpt")
    step = int(ckpt.name.removeprefix("step-"))
    again, again_log = c10d_node(tmp_path, "worker-0", port, True, args, overrides)
    nodes = [(again, again_log), (second, second_log)]
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while again.poll() is None or second.poll() is None:
        if second.poll() == LOST_PEER:  # the operator re-creates worker 1 too
            second, second_log = c10d_node(tmp_path, "worker-1", port, False, args, overrides)
            nodes[1] = (second, second_log)
        assert time.monotonic() < deadline, "\n".join(log.read_text()[-3000:] for _, log in nodes)
        time.sleep(0.5)
    logs = [log.read_text() for _, log in nodes]
    assert [proc.returncode for proc, _ in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert f"resumed from {ckpt} at step {step}" in logs[0] + logs[1], "\n".join(logs)
    steps = steps_logged(tmp_path)
    assert steps[-(12 - step) :] == list(range(step + 1, 13)) and sorted(set(steps)) == list(range(1, 13)), steps


def steps_logged(out: Path) -> list[int]:
    return [
        json.loads(line)["step"]
        for path in sorted(out.glob("worker-*/metrics.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


@pytest.mark.slow
def test_a_worker_0_stopped_in_the_exit_barrier_after_the_last_step_exits_0(tmp_path):
    # A pod deleted after its workers finished the run, while torchrun waits for the other node in its
    # exit barrier: 0, so the operator does not re-create a pod whose torchrun would wait for a
    # rendezvous no node joins. Worker 1's agent is held (SIGSTOP) so that worker 0 waits in the barrier.
    args = ["--max-restarts=3"]
    overrides = ["checkpoint.interval_steps=1000", "training.max_steps=4"]
    port = free_port()
    # Worker 0's agent logs at INFO, so that the test sees it enter the exit barrier.
    (first, first_log), (second, second_log) = (
        c10d_node(tmp_path, f"worker-{i}", port, i == 0, args, overrides, **({"LOGLEVEL": "INFO"} if i == 0 else {}))
        for i in (0, 1)
    )
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not worker_pids(second.pid):
        assert second.poll() is None and time.monotonic() < deadline, second_log.read_text()[-3000:]
        time.sleep(0.2)
    os.kill(second.pid, signal.SIGSTOP)  # its workers train on; the agent waits for nothing
    try:
        # Worker 0's trainer has ended after the last step: its agent is in the exit barrier.
        while not (steps_logged(tmp_path)[-1:] == [4] and not worker_pids(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()[-3000:]
            time.sleep(0.2)
        # torchrun's _exit_barrier logs this as it starts to wait, after the launcher noted the finish.
        wait_for_line(first_log, "Local worker group finished (WorkerState.SUCCEEDED)", first, 60)
        first.send_signal(signal.SIGTERM)
        log = finish_log(first, first_log, 60)
    finally:
        os.kill(second.pid, signal.SIGCONT)
    assert first.returncode == 0, log[-4000:]
    assert "after every worker of this node finished (in torchrun's exit barrier); exit status 0" in log
    log = finish_log(second, second_log, 120)
    assert second.returncode == 0, log[-4000:]
