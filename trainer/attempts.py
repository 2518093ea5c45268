"""A bound on a run's restarts that the Training Operator does not give: attempts counted on the shared volume.

Under `restartPolicy: ExitCode` the operator (v1.9) deletes and re-creates a pod that exits with a
retryable code (128 and above: a preemption, an OOM kill, a lost peer; pkg/controller.v1/common/pod.go),
and `backoffLimit` never sees it: pkg/core/job.go PastBackoffLimit adds up the containers' restartCount
of running pods, which is 0 in every re-created pod (read in kubeflow/training-operator v1.9.3). A
failure that repeats (a node that always OOMs, a peer lost at every start) then loops until
`activeDeadlineSeconds`, holding every GPU of the job. trainer.launch counts instead: every start
of a worker pod records one attempt, and the start after FSDP_MAX_RETRIES restarts exits 1 with one line,
which the operator treats as permanent, so the job fails.

Where: FSDP_ATTEMPTS_DIR (the generated jobs: /shared/runs/<run>/attempts, so a new run, which has a new
name, starts at zero), one folder per replica: FSDP_POD_NAME (<run>-worker-<i>, the name the operator
gives the pod again when it re-creates it), or node-<PET_NODE_RANK> under Kubeflow Trainer v2. Each
attempt is a file created with O_CREAT | O_EXCL, the one atomic "take the next number" every POSIX file
system (Lustre included) gives, so concurrent starts never share a number. Unset FSDP_ATTEMPTS_DIR:
nothing is counted (a run started by hand).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

DIR_ENV = "FSDP_ATTEMPTS_DIR"
MAX_ENV = "FSDP_MAX_RETRIES"
REPLICA_ENV = "FSDP_POD_NAME"
RESTARTS_ENV = "FSDP_RESTARTS"
# Without a pod name (a run started by hand with the directory set): one counter for the process' host.
DEFAULT_REPLICA = "local"


def record_attempt(directory: Path, replica: str) -> int:
    """Record one more attempt of `replica` under `directory`; returns its number (1 for the first)."""
    folder = directory / replica
    folder.mkdir(parents=True, exist_ok=True)
    n = len([p for p in folder.iterdir() if p.name.startswith("attempt-")]) + 1
    while True:
        try:
            fd = os.open(folder / f"attempt-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            n += 1
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {socket.gethostname()}\n")
        return n


def max_retries() -> int | None:
    """FSDP_MAX_RETRIES as a count, None when unset; a bad value is a one-line exit 2."""
    raw = os.environ.get(MAX_ENV, "")
    if not raw:
        return None
    if not raw.isdigit():
        print(f"error: {MAX_ENV}={raw!r}: must be a whole number of restarts, e.g. {MAX_ENV}=10", file=sys.stderr)
        sys.exit(2)
    return int(raw)


def count_this_start() -> None:
    """Record this start of the pod; exit 1 (permanent) when it is one restart too many."""
    directory = os.environ.get(DIR_ENV, "")
    bound = max_retries()
    if not directory or bound is None:
        return
    # Kubeflow Trainer v2 names pods with a random suffix; its node rank is the stable identity there.
    rank = os.environ.get("PET_NODE_RANK", "")
    replica = os.environ.get(REPLICA_ENV, "") or (f"node-{rank}" if rank else DEFAULT_REPLICA)
    n = record_attempt(Path(directory), replica)
    os.environ[RESTARTS_ENV] = str(n - 1)  # the trainer's progress annotations (trainer/progress.py) say it
    if n > bound + 1:
        print(
            f"error: {replica} started {n} times, more than {bound} restarts ({MAX_ENV}): a failure that repeats "
            f"after every restart; exit status 1 ends the job (attempts in {directory}/{replica})",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    if n > 1:
        print(f"launch: restart {n - 1} of at most {bound} ({replica})", file=sys.stderr, flush=True)
