"""A long step of the cluster harness's builds (a Go build of a binary, an image build) says that it
is still running: a line on stderr every interval while it runs, and nothing once it has ended. The
helper is the one tools/cluster/build.py and image/ run their long steps through; here it runs a
stand-in command with a short interval, in a process of its own as the build commands run."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from support import REPO_ROOT

LINE = re.compile(r"^build: stand-in still building, (\d+m)?\d+s elapsed$")


def run_helper(
    seconds: float, interval_s: float, exit_code: int = 0, after_s: float = 0.0
) -> subprocess.CompletedProcess:
    """Run a command of `seconds` through the helper; `after_s`: stay alive that long after it ended."""
    stand_in = f"import time, sys; time.sleep({seconds}); sys.exit({exit_code})"
    script = (
        "import sys, time\n"
        "from tools.cluster.build import run_with_progress\n"
        f"proc = run_with_progress([sys.executable, '-c', {stand_in!r}], 'build: stand-in', interval_s={interval_s})\n"
        "print(f'rc={proc.returncode}', file=sys.stderr, flush=True)\n"
        f"time.sleep({after_s})\n"
    )
    return subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_a_long_command_reports_every_interval_until_it_ends():
    started = time.monotonic()
    result = run_helper(seconds=1.3, interval_s=0.25, after_s=0.8)
    assert time.monotonic() - started < 30
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "rc=0"
    progress = lines[:-1]
    assert 3 <= len(progress) <= 6, result.stderr  # about 1.3 / 0.25, never after the end
    assert all(LINE.match(line) for line in progress), progress
    seconds = [int(re.search(r"(\d+)s elapsed", line).group(1)) for line in progress]
    assert seconds == sorted(seconds) and seconds[-1] >= 1


def test_a_quick_command_prints_nothing_and_its_exit_code_comes_back():
    result = run_helper(seconds=0.05, interval_s=5, exit_code=3)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "rc=3"


def test_elapsed_time_reads_in_minutes_and_seconds():
    from tools.cluster.build import elapsed_text

    assert [elapsed_text(s) for s in (0.4, 45, 60, 150.2, 3725)] == ["0s", "45s", "1m0s", "2m30s", "62m5s"]
