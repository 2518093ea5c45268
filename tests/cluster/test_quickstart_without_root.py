"""The README's test command run by a user who cannot become root: every tier runs or none, so it
stops in one line before anything is installed. Root runs it as that user (setpriv to uid 65534);
the rest of the quick start: tests/test_quickstart.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from quickstart_support import bin_with, checkout_copy

pytestmark = pytest.mark.realpods  # root: it drops to another user


def test_the_test_command_as_a_user_without_root_or_sudo_stops_with_one_line(tmp_path):
    """Every tier runs or none: a user who cannot become root is told how, before anything is installed."""
    # Outside pytest's tmp_path, whose parents only root may enter.
    tmp_path = Path(tempfile.mkdtemp(prefix="fsdp-quickstart-", dir="/tmp"))
    tmp_path.chmod(0o755)
    repo = checkout_copy(tmp_path)
    path = bin_with(tmp_path, bash="/bin/bash", id="/usr/bin/id", dirname="/usr/bin/dirname")
    proc = subprocess.run(
        ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "tools/test.sh"],
        cwd=repo,
        env={"PATH": str(path), "HOME": str(tmp_path), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "tools/test.sh: the real-pods tier needs root: run it as root ('sudo bash tools/test.sh')"
    ]
    assert sorted(p.name for p in repo.iterdir()) == ["tools"]
    shutil.rmtree(tmp_path)
