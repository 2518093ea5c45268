"""python -m trainer.launch: a rendezvous host that appears late does not fail the job.

The late host is real name resolution: each node runs in a private mount namespace (`unshare
--mount`, so as root) with a bind-mounted /etc/hosts that does not name the first worker yet; the
test adds the name later, as cluster DNS does once the first worker's pod exists, and only then
starts that worker. Both nodes are real torchrun agents (c10d) training the tiny config, one CPU rank
each. The launcher's other cases: tests/test_trainer_launch.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import (
    LAUNCH_TIMEOUT_S,
    TINY,
    finish,
    free_port,
    kill_processes_under,
    read_metrics,
    trainer_env,
    wait_for_line,
)

from trainer import launch

pytestmark = pytest.mark.realpods  # root: a mount namespace per node

HOST = "fsdp-late-worker-0"
BIND_HOSTS = 'mount --bind "$HOSTS" /etc/hosts || exit 99; exec "$@"'


def node(tmp_path: Path, name: str, port: int, is_host: bool, log: Path, **env: str) -> subprocess.Popen:
    cmd = [
        "unshare",
        "--mount",
        "sh",
        "-c",
        BIND_HOSTS,
        "sh",
        sys.executable,
        "-m",
        "trainer.launch",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={HOST}:{port}",
        "--rdzv-id=late-worker-test",
        f"--rdzv-conf=is_host={str(is_host).lower()}",
        "-m",
        "trainer.train",
        "--config",
        str(TINY),
        "training.max_steps=3",
        "checkpoint.dir=",
        "checkpoint.export_dir=",
        f"metrics.output_dir={tmp_path / name / 'metrics'}",
    ]
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(HOSTS=str(tmp_path / "hosts"), **env),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture(autouse=True)
def no_node_outlives_its_test(tmp_path):
    """Whatever a test ends with (a failed assertion included), its agents and trainer processes go."""
    yield
    kill_processes_under(tmp_path)


def keeps_waiting(proc: subprocess.Popen, log: Path, seconds: float) -> None:
    """The launcher is still waiting after `seconds`; fail at once, with its log, if it exits before."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, (
            f"exited {proc.returncode} while its host did not resolve:\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.1)


def test_a_worker_whose_rendezvous_host_appears_late_waits_and_trains(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text())
    port = free_port()
    second_log, first_log = tmp_path / "second.log", tmp_path / "first.log"
    second = node(tmp_path, "second", port, False, second_log, FSDP_RDZV_WAIT_S="300")
    wait_for_line(second_log, f"waiting for {HOST} to resolve", second)
    # Unresolvable for three of the launcher's polls: torchrun alone would have failed at the first.
    keeps_waiting(second, second_log, 3 * launch.POLL_S)
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
