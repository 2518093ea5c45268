"""A hung run is stopped within a bound of its own step time, with every rank's stack, as a restartable exit.

A collective that never returns (a peer wedged in NCCL, a dead EFA link, a rank stuck in I/O) blocks
every rank of the job without an error; NCCL's own timeout is off or long by default, and the job would
hold its GPUs until activeDeadlineSeconds. So:

- Each worker process (trainer.train) writes a heartbeat after every optimizer step and when it enters
  a phase with a longer bound (start, checkpoint, end): `<FSDP_HEARTBEAT_DIR>/rank-<RANK>`, one JSON
  object {pid, rank, phase, step, time, deadline, step_time_s}. `deadline` (Unix time) is when the next
  heartbeat is due:

      start       now + FSDP_HANG_FIRST_STEP_S (default 3600): model load, checkpoint load, the first
                  step and its compilation; also after a step until two steps have been timed
      step        now + max(FSDP_HANG_MIN_S (default 600), FSDP_HANG_FACTOR (default 10) x the slowest of
                  the last STEP_WINDOW step times measured by this process)
      checkpoint  now + FSDP_HANG_CHECKPOINT_S (default 1800): a save, or waiting for one in flight
      end         now + FSDP_HANG_CHECKPOINT_S: the export and the last barrier

  Each worker also dumps the stacks of all its threads to stderr on SIGUSR1 (faulthandler), which works
  while the process is blocked inside a C++ collective (`kill -USR1 <pid>` by hand too).
- trainer.launch (torchrun's agent, one per node) makes the folder, points the workers at it and reads
  it every FSDP_HANG_POLL_S seconds (default 5). When a live worker's deadline has passed, it prints one
  line, sends SIGUSR1 to every live worker of its node (their stacks go to the pod's log), waits
  FSDP_HANG_DUMP_WAIT_S (default 5), stops torchrun as for a preemption and kills the workers that do not
  stop, and exits HUNG (201): at least 128, so the Training Operator (restartPolicy ExitCode) and the
  TrainJob runtime's failure policy restart the run from its last checkpoint, and trainer.attempts
  bounds how often. Every node watches its own ranks; a hang blocks all ranks, so each node stops.
  FSDP_HANG_WATCHDOG=off turns the launcher's part off (the heartbeats and the metric stay).
- Global rank 0 serves its deadline as `fsdp_progress_deadline_timestamp_seconds` (trainer/metrics.py);
  the alert FsdpTrainingHung fires when the time is past it, that is when the watchdog should have
  acted (base/monitoring/configs/prometheusrule-fsdp.yaml).

A worker whose process is gone (crashed, or a previous worker group torchrun restarted) is left to
torchrun: only live processes are judged. Bad settings are one line and exit 2, from the launcher.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

DIR_ENV = "FSDP_HEARTBEAT_DIR"
SWITCH_ENV = "FSDP_HANG_WATCHDOG"
POLL_ENV = "FSDP_HANG_POLL_S"
DUMP_WAIT_ENV = "FSDP_HANG_DUMP_WAIT_S"
HUNG = 201  # restartable (>= 128), above LOST_PEER (200) and every 128 + signal number
STEP_WINDOW = 20
# After the stop was asked for, the workers that still run are killed this long later: a worker blocked
# in a collective never reaches the step boundary where it would act on SIGTERM.
KILL_AFTER_S = 2.0
PHASES = ("start", "step", "checkpoint", "end")


class BadSetting(ValueError):
    pass


def env_number(env: Mapping[str, str], name: str, default: float, *, positive: bool = True) -> float:
    """The number setting `name` of env (default when unset or empty); BadSetting names the fix."""
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 if positive else value >= 0):
        raise BadSetting(f"{name}={raw!r}: must be a {'positive ' if positive else ''}number, e.g. {name}={default:g}")
    return value


@dataclass(frozen=True, kw_only=True)
class HangBounds:
    """How long a phase may take before the run counts as hung (seconds); see the module docstring."""

    factor: float = 10.0  # x the slowest recent step time
    min_s: float = 600.0  # floor of a step's bound
    first_step_s: float = 3600.0  # start phase
    checkpoint_s: float = 1800.0  # checkpoint and end phases

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> HangBounds:
        return cls(
            factor=env_number(env, "FSDP_HANG_FACTOR", cls.factor),
            min_s=env_number(env, "FSDP_HANG_MIN_S", cls.min_s),
            first_step_s=env_number(env, "FSDP_HANG_FIRST_STEP_S", cls.first_step_s),
            checkpoint_s=env_number(env, "FSDP_HANG_CHECKPOINT_S", cls.checkpoint_s),
        )

    def bound_s(self, phase: str, step_time_s: float | None) -> float:
        if phase == "start" or (phase == "step" and step_time_s is None):
            return self.first_step_s
        if phase == "step":
            assert step_time_s is not None
            return max(self.min_s, self.factor * step_time_s)
        return self.checkpoint_s


class Heartbeat:
    """The worker's side: deadlines for the metric, and the heartbeat file where the launcher reads it."""

    def __init__(self, bounds: HangBounds, rank: int, folder: str = ""):
        self.bounds, self.rank = bounds, rank
        self.path = Path(folder) / f"rank-{rank}" if folder else None
        self.step = 0
        self.deadline = 0.0
        self._times: list[float] = []  # recent step durations
        self._last_step_at: float | None = None
        self.beat("start")

    @classmethod
    def from_env(cls, rank: int, env: Mapping[str, str] = os.environ) -> Heartbeat:
        """Also registers the SIGUSR1 stack dump. Bounds the launcher refused never get here; a bad one
        in a process started without it falls back to the defaults."""
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        try:
            bounds = HangBounds.from_env(env)
        except BadSetting:
            bounds = HangBounds()
        return cls(bounds, rank, env.get(DIR_ENV, ""))

    @property
    def step_time_s(self) -> float | None:
        """The slowest of the recent step times (None until two steps have been timed)."""
        return max(self._times) if self._times else None

    def beat(self, phase: str, step: int | None = None) -> None:
        """Record that `phase` starts now (for "step": that `step` has just completed)."""
        now = time.time()
        if phase == "step":
            if step is not None and self._last_step_at is not None and step > self.step:
                self._times = [*self._times, (now - self._last_step_at) / (step - self.step)][-STEP_WINDOW:]
            self._last_step_at = now
            self.step = step if step is not None else self.step
        else:
            self._last_step_at = None  # the time of a save or a load is no step time
        self.deadline = now + self.bounds.bound_s(phase, self.step_time_s)
        if self.path is None:
            return
        body = {
            "pid": os.getpid(),
            "rank": self.rank,
            "phase": phase,
            "step": self.step,
            "time": now,
            "deadline": self.deadline,
            "step_time_s": self.step_time_s,
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(body), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # the folder went away with the launcher: nothing watches this worker any more


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead worker torchrun has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def read_heartbeats(folder: Path) -> list[dict]:
    """The heartbeats of the live workers in `folder` (half-written or foreign files are skipped)."""
    beats = []
    for path in sorted(folder.glob("rank-*")):
        if path.name.endswith(".tmp"):
            continue
        try:
            beat = json.loads(path.read_text(encoding="utf-8"))
            pid, deadline = int(beat["pid"]), float(beat["deadline"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            beats.append({**beat, "pid": pid, "deadline": deadline})
    return beats


def _describe(beat: dict, now: float) -> str:
    step_time = beat.get("step_time_s")
    measured = f", measured step time {step_time:.1f} s" if isinstance(step_time, (int, float)) else ""
    waited = now - float(beat.get("time", now))
    return (
        f"rank {beat.get('rank')} made no progress for {waited:.0f} s in phase {beat.get('phase')} "
        f"after step {beat.get('step')}{measured}"
    )


class HangWatch:
    """The launcher's side; `stop(reason, status)` is called once when a live worker is past its deadline."""

    def __init__(self, folder: Path, poll_s: float = 5.0, dump_wait_s: float = 5.0):
        self.folder, self.poll_s, self.dump_wait_s = folder, poll_s, dump_wait_s
        self.hung = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] = os.environ) -> HangWatch | None:
        """The watch for this node, with FSDP_HEARTBEAT_DIR set in `env` for the workers; None when off.
        A bad setting is one line and exit 2."""
        switch = env.get(SWITCH_ENV, "") or "on"
        try:
            if switch not in ("on", "off"):
                raise BadSetting(f"{SWITCH_ENV}={switch!r}: use on or off")
            HangBounds.from_env(env)  # the workers read them; a bad one is said here, once
            poll_s = env_number(env, POLL_ENV, 5.0)
            dump_wait_s = env_number(env, DUMP_WAIT_ENV, 5.0, positive=False)
        except BadSetting as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        if switch == "off":
            return None
        folder = Path(tempfile.mkdtemp(prefix="fsdp-heartbeat-"))
        env[DIR_ENV] = str(folder)
        return cls(folder, poll_s, dump_wait_s)

    def start(self, stop: Callable[[str, int], None]) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="hang-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.dump_wait_s + KILL_AFTER_S + 5)
        shutil.rmtree(self.folder, ignore_errors=True)

    def check(self, now: float | None = None) -> list[dict]:
        """The live workers past their deadline."""
        now = time.time() if now is None else now
        return [b for b in read_heartbeats(self.folder) if b["deadline"] < now]

    def _run(self, stop: Callable[[str, int], None]) -> None:
        while not self._done.wait(self.poll_s):
            late = self.check()
            if late:
                self._act(late, stop)
                return

    def _act(self, late: list[dict], stop: Callable[[str, int], None]) -> None:
        now = time.time()
        first = min(late, key=lambda b: b["deadline"])
        self.hung = (
            f"the run is hung: {_describe(first, now)}, past its bound; every rank's stack is in this log above "
            f"(SIGUSR1); exit status {HUNG}, the restarted run resumes from its last checkpoint"
        )
        workers = read_heartbeats(self.folder)
        print(
            f"launch: {_describe(first, now)}; dumping the stacks of ranks "
            f"{', '.join(str(b['rank']) for b in workers)} (SIGUSR1)",
            file=sys.stderr,
            flush=True,
        )
        for beat in workers:
            _signal(beat["pid"], signal.SIGUSR1)
        if self._done.wait(self.dump_wait_s):
            return  # torchrun ended meanwhile
        stop(self.hung, HUNG)
        if self._done.wait(KILL_AFTER_S):
            return
        for beat in read_heartbeats(self.folder):
            _signal(beat["pid"], signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass  # it ended meanwhile
