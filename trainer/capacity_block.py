"""Stop a run with a checkpoint before its EC2 Capacity Block ends.

A Capacity Block has an end time, and "thirty minutes before the reservation expires, we begin to
terminate any instances that are still running in the Capacity Block" (AWS, Amazon EC2 User Guide,
"Work with Capacity Blocks"). A run still training then loses everything since its last interval
checkpoint, and its pods wait for nodes that do not come. So trainer.launch reads the block's end
time from FSDP_CAPACITY_BLOCK_FILE (the generated jobs mount ConfigMap fsdp-capacity-block, written
from the cluster's `capacity_block_end` in matrix.yaml; empty when the cluster has none) and, at

    end - TERMINATION_LEAD_S (AWS's 30 minutes) - FSDP_TERM_GRACE_S (the checkpoint's time) - MARGIN_S,

stops torchrun the way a preemption does: SIGTERM, the workers finish their step, write a checkpoint
and exit. The run then ends with exit status 1 and one line (a permanent exit: the job fails rather
than waiting for nodes of an expired block, and Kueue frees its quota); bumping the run's `retry`
once the next block is set resumes it from that checkpoint. The file is read again every POLL_S
seconds: a ConfigMap volume follows its ConfigMap, so a later end (an extended or new block) applied
while the run trains moves the stop without touching the PyTorchJob. A run that starts after its stop
time exits 1 at once.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable

FILE_ENV = "FSDP_CAPACITY_BLOCK_FILE"
GRACE_ENV = "FSDP_TERM_GRACE_S"
POLL_ENV = "FSDP_CAPACITY_BLOCK_POLL_S"
# AWS starts terminating a Capacity Block's instances this long before its end time.
TERMINATION_LEAD_S = 1800.0
# Room for a slow last step and the pods' own shutdown after the checkpoint.
MARGIN_S = 300.0
POLL_S = 30.0


class BadEndTime(ValueError):
    pass


def parse_end(text: str) -> float | None:
    """The block's end as a Unix time, None when the file is empty. ISO 8601 with a zone, e.g.
    2026-12-10T11:30:00Z (the form `aws ec2 describe-capacity-reservations` prints)."""
    text = text.strip()
    if not text:
        return None
    try:
        end = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadEndTime(f"{text!r} is not an ISO 8601 time") from None
    if end.tzinfo is None:
        raise BadEndTime(f"{text!r} has no time zone; write it in UTC, e.g. 2026-12-10T11:30:00Z")
    return end.timestamp()


def stop_time(end: float, grace_s: float) -> float:
    return end - TERMINATION_LEAD_S - grace_s - MARGIN_S


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _grace_s() -> float:
    try:
        return float(os.environ.get(GRACE_ENV, "") or 30.0)
    except ValueError:
        return 30.0  # trainer.launch reports a bad value itself


class BlockWatch:
    """Reads the end time; `stop(reason)` is called once when the stop time has come."""

    def __init__(self, path: str, grace_s: float, poll_s: float = POLL_S):
        self.path, self.grace_s, self.poll_s = path, grace_s, poll_s
        self.end: float | None = None
        self._done = threading.Event()

    @classmethod
    def from_env(cls) -> BlockWatch | None:
        path = os.environ.get(FILE_ENV, "")
        if not path:
            return None
        try:
            poll = float(os.environ.get(POLL_ENV, "") or POLL_S)
        except ValueError:
            poll = POLL_S
        return cls(path, _grace_s(), poll)

    def read(self) -> float | None:
        """The end time in the file now; a missing file is no block (the ConfigMap is optional)."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                return parse_end(fh.read())
        except FileNotFoundError:
            return None

    def reason(self) -> str:
        assert self.end is not None
        return (
            f"the Capacity Block ends at {_when(self.end)} and AWS terminates its instances from "
            f"{TERMINATION_LEAD_S / 60:.0f} minutes before; stopped at {_when(stop_time(self.end, self.grace_s))} "
            "with a checkpoint; exit status 1: set the next block's capacity_block_end and bump the run's retry "
            "to resume"
        )

    def check_at_start(self) -> None:
        """Exit 1 (one line) when the stop time has passed already; exit 2 for an unreadable end time."""
        try:
            self.end = self.read()
        except BadEndTime as err:
            print(f"error: {FILE_ENV}={self.path}: {err}", file=sys.stderr)
            sys.exit(2)
        if self.end is not None and time.time() >= stop_time(self.end, self.grace_s):
            print(f"error: not starting: {self.reason()}", file=sys.stderr, flush=True)
            sys.exit(1)

    def start(self, stop: Callable[[str], None]) -> None:
        threading.Thread(target=self._run, args=(stop,), name="capacity-block", daemon=True).start()

    def close(self) -> None:
        self._done.set()

    def _run(self, stop: Callable[[str], None]) -> None:
        while not self._done.wait(self.poll_s if self.end is None else self._sleep()):
            try:
                self.end = self.read()
            except BadEndTime as err:
                print(f"launch: {FILE_ENV}: {err}; keeping the previous end time", file=sys.stderr, flush=True)
            if self.end is not None and time.time() >= stop_time(self.end, self.grace_s):
                stop(self.reason())
                return

    def _sleep(self) -> float:
        assert self.end is not None
        return max(0.0, min(self.poll_s, stop_time(self.end, self.grace_s) - time.time()))
