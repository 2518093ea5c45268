"""Per run: a multi-node job whose NCCL came up on TCP sockets while EFA was expected fails fast.

NCCL falls back to its socket transport when the EFA provider cannot be used (a missing device plugin,
no vpc.amazonaws.com/efa in the pod, a broken aws-ofi-nccl), and the job then trains at a fraction of
its speed without an error. The NCCL pre-flight Job (trainer/preflight.py) checks one pair of nodes
per cluster; this checks every run, from its own NCCL log:

- trainer.launch, when FSDP_EXPECT_TRANSPORT is set (the generated multi-node jobs on EFA instances:
  efa) and the job has more than one node, starts the workers with NCCL_DEBUG=INFO,
  NCCL_DEBUG_SUBSYS=INIT,NET and NCCL_DEBUG_FILE=<a private folder>/nccl.%h.%p, so NCCL writes each
  process' log to a file instead of the pod's output;
- it reads those files every POLL_S seconds, passes on the lines the pod's own NCCL_DEBUG level would
  have printed (WARN by default) to stderr, and finds the network transport with
  trainer.preflight.detect_transport over the lines that name it ("via NET/...", "Using network ...");
- a transport other than the expected one ends the run with exit status 1 and one line
  (FSDP_TRANSPORT_CHECK=fail, the default), or prints that line once and trains on
  (FSDP_TRANSPORT_CHECK=warn). Single-node jobs and FSDP_TRANSPORT_CHECK=off are left alone, as is a
  pod that sets NCCL_DEBUG_FILE itself.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, MutableMapping
from pathlib import Path

from trainer.preflight import detect_transport

EXPECT_ENV = "FSDP_EXPECT_TRANSPORT"
MODE_ENV = "FSDP_TRANSPORT_CHECK"
MODES = ("fail", "warn", "off")
POLL_S = 2.0
NETWORKS = ("efa", "ib", "socket")
_NET_LINE = re.compile(r"via NET/|Using network ")
_LEVELS = {"VERSION": 0, "WARN": 1, "INFO": 2, "ABORT": 0, "TRACE": 3}
# "host:pid:tid [rank] NCCL WARN ..." / "... NCCL INFO ..."
_LEVEL = re.compile(r"\bNCCL (WARN|INFO|TRACE|ABORT)\b")


def network_transport(text: str) -> str | None:
    """The inter-node transport the log names (efa, ib, socket, unknown), None while it names none yet."""
    lines = "\n".join(line for line in text.splitlines() if _NET_LINE.search(line))
    return detect_transport(lines) if lines else None


class TransportWatch:
    """Sets up NCCL's log files for the workers and judges the transport from them."""

    def __init__(self, expected: str, mode: str, folder: Path, shown_level: str, poll_s: float = POLL_S):
        self.expected, self.mode, self.folder, self.poll_s = expected, mode, folder, poll_s
        self.shown = _LEVELS.get(shown_level.upper(), 1)
        self.transport: str | None = None
        self._offsets: dict[Path, int] = {}
        self._text: dict[Path, str] = {}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, max_nodes: int, env: MutableMapping[str, str] = os.environ) -> TransportWatch | None:
        """A watch for this pod, with NCCL's variables set in `env` for the workers; None when no check applies."""
        expected = env.get(EXPECT_ENV, "")
        mode = env.get(MODE_ENV, "") or "fail"
        if mode not in MODES:
            print(f"error: {MODE_ENV}={mode!r}: use one of {', '.join(MODES)}", file=sys.stderr)
            sys.exit(2)
        if not expected or mode == "off" or max_nodes <= 1:
            return None
        if env.get("NCCL_DEBUG_FILE"):
            print(
                f"launch: NCCL_DEBUG_FILE is set, so the transport check ({EXPECT_ENV}={expected}) is off",
                file=sys.stderr,
                flush=True,
            )
            return None
        shown = env.get("NCCL_DEBUG", "") or "WARN"
        folder = Path(tempfile.mkdtemp(prefix="fsdp-nccl-"))
        env["NCCL_DEBUG"] = "INFO" if _LEVELS.get(shown.upper(), 1) <= 2 else shown
        subsys = [s for s in env.get("NCCL_DEBUG_SUBSYS", "").split(",") if s]
        if subsys and not subsys[0].startswith("^"):
            env["NCCL_DEBUG_SUBSYS"] = ",".join(dict.fromkeys([*subsys, "INIT", "NET"]))
        elif not subsys:
            env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
        env["NCCL_DEBUG_FILE"] = str(folder / "nccl.%h.%p")
        return cls(expected, mode, folder, shown)

    def poll(self) -> str | None:
        """Read what NCCL wrote since the last call, pass on the lines the pod would show, and return the
        network transport once one is named (None before)."""
        for path in sorted(self.folder.glob("nccl.*")):
            try:
                with path.open("rb") as fh:
                    fh.seek(self._offsets.get(path, 0))
                    chunk = fh.read()
            except OSError:
                continue
            if not chunk:
                continue
            # Only whole lines: NCCL may be in the middle of one.
            end = chunk.rfind(b"\n") + 1
            if end == 0:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + end
            text = chunk[:end].decode("utf-8", "replace")
            for line in text.splitlines():
                m = _LEVEL.search(line)
                if m and _LEVELS[m.group(1)] <= self.shown:
                    print(line, file=sys.stderr, flush=True)
            if self.transport is None:
                self._text[path] = self._text.get(path, "") + "".join(
                    line + "\n" for line in text.splitlines() if _NET_LINE.search(line)
                )
        if self.transport is None:
            found = [t for t in (network_transport(v) for v in self._text.values()) if t]
            if found:
                # The slowest transport any process uses is the one that limits the job.
                self.transport = next((t for t in ("socket", "ib", "efa") if t in found), found[0])
                self._text.clear()
        return self.transport

    def mismatch(self) -> str:
        """The one line for a transport other than the expected one ("" when it is the expected one)."""
        if self.transport is None or self.transport == self.expected:
            return ""
        hint = (
            ": check the EFA device plugin on the nodes, the pod's vpc.amazonaws.com/efa resources and FI_PROVIDER"
            if self.expected == "efa"
            else ""
        )
        return f"NCCL uses the {self.transport} transport between nodes, expected {self.expected}{hint}"

    def failure(self) -> str:
        """The reason to stop the run for a transport other than the expected one ("" for none, or in warn mode)."""
        line = self.mismatch()
        return f"{line}; exit status 1 ({MODE_ENV}=warn only warns)" if line and self.mode != "warn" else ""

    def start(self, stop: Callable[[str], None]) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name="transport-check", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching and pass on what is left of the logs."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.poll()

    def _run(self, stop: Callable[[str], None]) -> None:
        judged = False
        while not self._done.wait(self.poll_s):
            transport = self.poll()
            if transport is None or judged:
                continue
            judged = True
            line = self.mismatch()
            if not line:
                continue
            if self.mode == "warn":
                print(f"warning: {line} ({MODE_ENV}=warn: training on)", file=sys.stderr, flush=True)
            else:
                stop(self.failure())
