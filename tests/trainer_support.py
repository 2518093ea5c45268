"""Launching the trainer through real torchrun on CPU for the trainer tests.

Every launch uses `python -m torch.distributed.run --standalone` (a free rendezvous port is picked
by torchrun), one OpenMP thread per rank (the machine has few cores and CPU matmuls stay
deterministic), and writes all outputs under the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from support import REPO_ROOT

TINY = REPO_ROOT / "trainer" / "configs" / "tiny.yaml"
LAUNCH_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def trainer_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(extra)
    return env


def output_overrides(out: Path) -> list[str]:
    """Point every output of a run at `out`."""
    return [f"checkpoint.dir={out / 'ckpt'}", f"metrics.output_dir={out / 'metrics'}", "checkpoint.export_dir="]


def torchrun_cmd(
    overrides: Sequence[str], *, nproc: int = 2, config: Path = TINY, torchrun_args: Sequence[str] = ()
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *torchrun_args,
        "-m",
        "trainer.train",
        "--config",
        str(config),
        *overrides,
    ]


def start(overrides: Sequence[str], **kwargs) -> subprocess.Popen:
    # A session of its own, so a hung launch can be stopped with all its workers (see finish).
    return subprocess.Popen(
        torchrun_cmd(overrides, **kwargs),
        cwd=REPO_ROOT,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT_S) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish in {timeout}s:\n{out[-4000:]}") from None
    return out


def run(overrides: Sequence[str], *, expect_rc: int = 0, **kwargs) -> str:
    """Run torchrun to completion; fails the test with the output tail on an unexpected status."""
    proc = start(overrides, **kwargs)
    out = finish(proc)
    assert proc.returncode == expect_rc, f"exit {proc.returncode}, expected {expect_rc}:\n{out[-4000:]}"
    return out


def launcher_cmd(overrides: Sequence[str], nproc: int = 2) -> list[str]:
    """`python -m trainer.launch --standalone` of the tiny config on `nproc` CPU ranks."""
    return [
        sys.executable,
        "-m",
        "trainer.launch",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "trainer.train",
        "--config",
        str(TINY),
        *overrides,
    ]


def start_launcher(
    overrides: Sequence[str], nproc: int = 2, prefix: Sequence[str] = (), env: dict[str, str] | None = None
) -> subprocess.Popen:
    """launcher_cmd started (after `prefix`, a command that runs it), its output piped."""
    return subprocess.Popen(
        [*prefix, *launcher_cmd(overrides, nproc)],
        cwd=REPO_ROOT,
        env=env or trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run_launcher(overrides: Sequence[str], expect_rc: int = 0, **kwargs) -> str:
    """start_launcher to its end, which must be `expect_rc`: its output."""
    proc = start_launcher(overrides, **kwargs)
    out = finish(proc)
    assert proc.returncode == expect_rc, f"exit {proc.returncode}, expected {expect_rc}:\n{out[-4000:]}"
    return out


def read_metrics(out: Path) -> list[dict]:
    path = out / "metrics" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses_by_step(records: Sequence[dict]) -> dict[int, float]:
    """The last logged loss of every step (a restarted run logs redone steps again)."""
    return {r["step"]: r["loss"] for r in records}


def worker_pids(parent: int) -> dict[int, int]:
    """{rank: pid} of the trainer processes torchrun (pid `parent`) started."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry)
    return found


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"torchrun exited ({proc.returncode}) before {what}:\n{out[-4000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_for_line(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Poll the process's log file until it holds `text`; fail with the log's end if the process exits
    first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def kill_rank_after_checkpoint(proc: subprocess.Popen, ckpt_dir: Path, step: int, rank: int = 1) -> None:
    """SIGKILL one worker as soon as the checkpoint of `step` is complete."""
    marker = ckpt_dir / f"step-{step:08d}" / "COMPLETE"
    wait_for(marker.exists, proc, LAUNCH_TIMEOUT_S, f"checkpoint {marker}")
    pids = worker_pids(proc.pid)
    assert rank in pids, f"worker of rank {rank} not found among {pids}"
    os.kill(pids[rank], signal.SIGKILL)


def kill_processes_under(folder: Path) -> list[int]:
    """SIGKILL every process whose command line names `folder` (a test's tmp_path): the launch agents
    and the trainer processes they started in sessions of their own, also after an agent died and
    its workers were left to init. Returns the pids killed."""
    killed = []
    needle = str(folder).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except ProcessLookupError:
                pass
    return killed
