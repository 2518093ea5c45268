"""python -m trainer.launch: a rendezvous host that appears late does not fail the job.

The late host is real name resolution: each node runs in a private mount namespace (`unshare
--mount`, root as here and in CI) with a bind-mounted /etc/hosts that does not name the first
worker yet; the test adds the name later, as cluster DNS does once the first worker's pod exists,
and only then starts that worker. Both nodes are real torchrun agents (c10d) training the tiny
config, one CPU rank each.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer_support import LAUNCH_TIMEOUT_S, REPO_ROOT, TINY, finish, free_port, read_metrics, trainer_env

HOST = "fsdp-late-worker-0"
BIND_HOSTS = 'mount --bind "$HOSTS" /etc/hosts || exit 99; exec "$@"'


def node(tmp_path: Path, name: str, port: int, is_host: bool, log: Path, **env: str) -> subprocess.Popen:
    cmd = ["unshare", "--mount", "sh", "-c", BIND_HOSTS, "sh",
           sys.executable, "-m", "trainer.launch", "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint={HOST}:{port}", "--rdzv-id=late-worker-test",
           f"--rdzv-conf=is_host={str(is_host).lower()}",
           "-m", "trainer.train", "--config", str(TINY), "training.max_steps=3", "checkpoint.dir=",
           "checkpoint.export_dir=", f"metrics.output_dir={tmp_path / name / 'metrics'}"]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=trainer_env(HOSTS=str(tmp_path / "hosts"), **env),
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_line(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_worker_whose_rendezvous_host_appears_late_waits_and_trains(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text())
    port = free_port()
    second_log, first_log = tmp_path / "second.log", tmp_path / "first.log"
    second = node(tmp_path, "second", port, False, second_log, FSDP_RDZV_WAIT_S="300")
    wait_for_line(second_log, f"waiting for {HOST} to resolve", second)
    time.sleep(3)  # unresolvable for a while: torchrun alone would be failing by now
    with hosts.open("a") as fh:  # in place: the bind mount follows the file, not the name
        fh.write(f"127.0.0.1 {HOST}\n")
    wait_for_line(second_log, f"waiting for the rendezvous store at {HOST}:{port}", second)
    first = node(tmp_path, "first", port, True, first_log)
    for proc, log in ((first, first_log), (second, second_log)):
        finish(proc, LAUNCH_TIMEOUT_S)
        assert proc.returncode == 0, f"exit {proc.returncode}:\n{log.read_text()[-4000:]}"
    writer = next(tmp_path / name for name in ("first", "second") if (tmp_path / name / "metrics").is_dir())
    records = read_metrics(writer)
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["world_size"] == 2


@pytest.mark.slow
def test_a_host_that_never_resolves_fails_in_one_line_after_the_window(tmp_path):
    env = trainer_env(FSDP_RDZV_WAIT_S="2")
    done = subprocess.run([sys.executable, "-m", "trainer.launch", "--nnodes=2", "--nproc_per_node=1",
                           "--rdzv-backend=c10d", "--rdzv-endpoint=fsdp-never.invalid:29400", "--rdzv-id=x",
                           "-m", "trainer.train", "--config", str(TINY)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "fsdp-never.invalid did not resolve within 2 s" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_bad_wait_setting_is_one_line_exit_2():
    done = subprocess.run([sys.executable, "-m", "trainer.launch", "--nnodes=2", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=somewhere:29400", "-m", "trainer.train", "--config", str(TINY)],
                          cwd=REPO_ROOT, env=trainer_env(FSDP_RDZV_WAIT_S="ten minutes"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: FSDP_RDZV_WAIT_S='ten minutes': must be a number of seconds, e.g. FSDP_RDZV_WAIT_S=900"], done


@pytest.mark.slow
def test_sigterm_while_waiting_exits_143(tmp_path):
    # A pod deleted while its worker waits for the first one: a status the operator restarts, at once
    # (as a container's first process, an unhandled SIGTERM would be ignored until the grace period ends).
    log = tmp_path / "wait.log"
    proc = subprocess.Popen([sys.executable, "-m", "trainer.launch", "--nnodes=2", "--nproc_per_node=1",
                             "--rdzv-backend=c10d", "--rdzv-endpoint=fsdp-never.invalid:29400", "--rdzv-id=x",
                             "-m", "trainer.train", "--config", str(TINY)],
                            cwd=REPO_ROOT, env=trainer_env(FSDP_RDZV_WAIT_S="300"), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_line(log, "waiting for fsdp-never.invalid to resolve", proc)
    proc.send_signal(signal.SIGTERM)
    finish(proc, 60)
    assert proc.returncode == 143, log.read_text()
