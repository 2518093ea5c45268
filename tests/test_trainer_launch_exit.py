"""python -m trainer.launch leaves with its status, not by SIGABRT, when a torchrun thread is still running.

After a signal torchrun leaves its rendezvous handler open, and the handler's keep-alive timer is a daemon
thread that calls the c10d TCPStore. If the interpreter shuts down while such a thread is inside the store
call (GIL released), Python ends the thread with pthread_exit when it comes back, the unwind through the
C++ call ends in std::terminate, and the launcher dies with SIGABRT ("terminate called without an active
exception") instead of exiting 143. The first test makes that race certain: the launcher runs as its own
`__main__` in a process that already has such a daemon thread (a store wait of 20 ms, over and over) and a
large module to tear down, is stopped by SIGTERM while it waits for a rendezvous host, and must exit 143.
The last one is the real thing: two nodes of a job (trainer.launch, c10d, one CPU rank each), one of them
stopped by SIGTERM after the first checkpoint, both exiting 143 without the line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import LAUNCH_TIMEOUT_S, TINY, free_port, kill_processes_under, trainer_env

ABORT = "terminate called"

# A store-calling daemon thread (as torchrun's rendezvous keep-alive) and a slow interpreter shutdown,
# then trainer.launch as the program: `python -c BUSY_EXIT <trainer.launch arguments>`.
BUSY_EXIT = """
import datetime, runpy, sys, threading, time
import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
TEARDOWN = [[{} for _ in range(50)] for _ in range(60_000)]  # freed at shutdown: it takes a while


def keep_alive():
    while True:
        try:
            store.wait(["never"], datetime.timedelta(milliseconds=20))  # in C++, GIL released
        except Exception:
            pass


threading.Thread(target=keep_alive, daemon=True).start()
time.sleep(0.1)
sys.argv = ["trainer.launch", *sys.argv[1:]]
runpy.run_module("trainer.launch", run_name="__main__", alter_sys=True)
"""

WAITING = [
    "--nnodes=2",
    "--nproc_per_node=1",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=fsdp-never.invalid:29400",
    "--rdzv-id=x",
    "-m",
    "trainer.train",
    "--config",
    str(TINY),
]


@pytest.fixture(autouse=True)
def no_node_outlives_its_test(tmp_path):
    yield
    kill_processes_under(tmp_path)


def wait_for_text(log: Path, text: str, proc: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} first:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in time:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def ended(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"not finished in {timeout}s:\n{log.read_text()[-3000:]}") from None
    return log.read_text()


def test_sigterm_exits_143_while_a_store_thread_is_still_running(tmp_path):
    log = tmp_path / "launch.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY_EXIT, *WAITING],
        cwd=REPO_ROOT,
        env=trainer_env(FSDP_RDZV_WAIT_S="300"),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_text(log, "waiting for fsdp-never.invalid to resolve", proc)
    proc.send_signal(signal.SIGTERM)
    out = ended(proc, log, 120)
    assert (proc.returncode, ABORT in out) == (143, False), f"exit {proc.returncode}:\n{out[-3000:]}"


def test_a_bad_setting_exits_2_with_its_line_while_a_store_thread_is_still_running():
    done = subprocess.run(
        [sys.executable, "-c", BUSY_EXIT, *WAITING],
        cwd=REPO_ROOT,
        env=trainer_env(FSDP_RDZV_WAIT_S="ten minutes"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The lines before it are the store's own warnings about the waits that timed out.
    assert (done.returncode, ABORT in done.stderr, done.stderr.strip().splitlines()[-1]) == (
        2,
        False,
        "error: FSDP_RDZV_WAIT_S='ten minutes': must be a number of seconds, e.g. FSDP_RDZV_WAIT_S=900",
    ), done


@pytest.mark.parametrize(
    ("body", "status", "stderr"),
    [
        ("return 143", 143, ""),
        ("sys.exit(2)", 2, ""),
        ("sys.exit()", 0, ""),
        ("sys.exit('error: one line')", 1, "error: one line\n"),
        ("raise RuntimeError('boom')", 1, "RuntimeError: boom\n"),
    ],
)
def test_exit_now_leaves_with_the_status_after_flushing_both_streams(body, status, stderr):
    # Output still in the buffers of a pipe when the process leaves through os._exit would be lost.
    program = (
        "import sys\nfrom trainer.launch import exit_now\n"
        "def run():\n    print('written', end='')\n    print('err', end='', file=sys.stderr)\n"
        f"    {body}\nexit_now(run)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO_ROOT, env=trainer_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == status and done.stdout == "written", done
    assert done.stderr.startswith("err") and done.stderr.endswith(stderr), done


LATE_WORKER = """import atexit, os, time
if os.environ.get("RANK") == "1":
    atexit.register(time.sleep, 3.0)
"""


@pytest.mark.slow
def test_a_drained_node_and_its_peer_both_exit_143_without_an_abort(tmp_path):
    port = free_port()
    nodes = []
    for i in (0, 1):
        (tmp_path / f"node-{i}").mkdir()
        log = tmp_path / f"node-{i}" / "launch.log"
        cmd = [
            sys.executable,
            "-m",
            "trainer.launch",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=exit-test",
            f"--rdzv-conf=is_host={str(i == 0).lower()}",
            "-m",
            "trainer.train",
            "--config",
            str(TINY),
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            "checkpoint.interval_steps=1",
            "checkpoint.export_dir=",
            "training.max_steps=400",
            f"metrics.output_dir={tmp_path / f'node-{i}'}",
        ]
        env = trainer_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        if i == 1:
            # The peer's worker leaves 3 s after its checkpoint: the store on node 0 must still be there
            # for the peer's torchrun until then (without the wait, it reads a lost peer and exits 200).
            (tmp_path / "late").mkdir()
            (tmp_path / "late" / "sitecustomize.py").write_text(LATE_WORKER)
            env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "late"), env["PYTHONPATH"]])
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        nodes.append((proc, log))
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not any((tmp_path / "ckpt").glob("step-*/COMPLETE")):
        for proc, log in nodes:
            assert proc.poll() is None, f"exited {proc.returncode} before a checkpoint:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    nodes[0][0].send_signal(signal.SIGTERM)  # the node whose agent serves the store: a drain of worker 0
    outs = [ended(proc, log, LAUNCH_TIMEOUT_S) for proc, log in nodes]
    assert [(proc.returncode, ABORT in out) for (proc, _), out in zip(nodes, outs, strict=True)] == [
        (143, False),
        (143, False),
    ], "\n".join(out[-2500:] for out in outs)
