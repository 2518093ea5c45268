"""Start processes on loopback and stop every one of them, whatever happens.

Each process runs in its own process group (so a wrapper and what it execs die together) and with
the parent-death signal set to SIGKILL (so a killed test runner leaves nothing behind). Everything
started is also recorded in a module-level registry that an atexit hook empties, which covers a
KeyboardInterrupt or an exception between fixtures. Readiness waits always check that the process
is still alive and have a deadline: a port another program took shows up as the process's own
error (for example "address already in use") within seconds, never as a hang.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class StartError(RuntimeError):
    """A process exited or did not become ready; the message holds the end of its log."""


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, check: Callable[[], bool], timeout_s: float, what: str = "ready") -> None:
        """Poll `check` until it is true; fail at once if the process exits, or after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.popen.poll() is not None:
                raise StartError(
                    f"{self.name} exited with {self.popen.returncode} before it was {what}; "
                    f"end of {self.log}:\n{self.tail()}"
                )
            try:
                if check():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise StartError(
                    f"{self.name} was not {what} after {timeout_s:.0f} s; end of {self.log}:\n{self.tail()}"
                )
            time.sleep(0.25)


_RUNNING: dict[int, Process] = {}
# Every pid started and every port handed out in this interpreter, for the suite's leak check.
STARTED: list[int] = []
PORTS: set[int] = set()


def start(
    name: str, args: Sequence[object], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Process:
    """Start `args` (each turned into a string) in a session of its own, output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [str(a) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    proc = Process(name, popen, log)
    _RUNNING[popen.pid] = proc
    STARTED.append(popen.pid)
    return proc


def stop(proc: Process, timeout_s: float = 10) -> None:
    """SIGTERM the process group, SIGKILL what is left after timeout_s; reap the process."""
    _RUNNING.pop(proc.pid, None)
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The group leader is gone; anything it started in its group goes with this signal too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break


def stop_all() -> None:
    for proc in reversed(list(_RUNNING.values())):
        stop(proc, timeout_s=5)


def running() -> list[Process]:
    return list(_RUNNING.values())


atexit.register(stop_all)


def free_port() -> int:
    """A loopback port nothing listens on now. Another program may take it before the component
    binds it; the component then exits with its bind error and wait_ready reports that."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    PORTS.add(port)
    return port


def leftovers() -> list[str]:
    """What outlived its stop: processes in the groups of started pids, listeners on handed-out ports."""
    found = []
    groups = set(STARTED)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgid = fields[0], int(fields[2])
        if (int(entry.name) in groups or pgid in groups) and state != "Z":
            found.append(f"process {entry.name} ({stat.split('(', 1)[1].split(')')[0]}) still runs")
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            port = int(cols[1].rsplit(":", 1)[1], 16)
            if cols[3] == "0A" and port in PORTS and not _held_by_another_worker(int(cols[9])):  # 0A: LISTEN
                found.append(f"port {port} still listens")
    return found


def _held_by_another_worker(inode: int) -> bool:
    """Whether the listening socket `inode` belongs to a process of another test worker: one that
    descends from this process's parent (pytest-xdist's controller) through another child. The port was
    free when another worker's free_port() handed it out again after this one's component stopped; a
    listener of this process's own descendants, or of a process that left every tree, is not."""
    owners = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    owners.append(int(entry.name))
                    break
            except OSError:
                continue
    me, parent = os.getpid(), os.getppid()
    for pid in owners:
        chain = pid
        while chain > 1 and chain != me:
            try:
                up = int((Path("/proc") / str(chain) / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
            if up == parent:
                return True  # a child of the controller other than this worker
            chain = up
    return False


def in_netns(holder: int, fn: Callable[[], Any]) -> Any:
    """Run fn() on a new thread that joined `holder`'s network namespace (sockets it opens live there):
    the real-pods level's components listen only inside it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            fd = os.open(f"/proc/{holder}/ns/net", os.O_RDONLY)
            try:
                if ctypes.CDLL("libc.so.6", use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the cluster's network namespace failed")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")
