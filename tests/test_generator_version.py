"""Every command answers --version with the project's one version (pyproject.toml), installed or not."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from support import REPO_ROOT

VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("command", ["expand", "cluster", "validate", "report", "status"])
def test_every_command_prints_the_project_version(command):
    proc = subprocess.run(
        [sys.executable, f"generators/{command}.py", "--version"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"fsdp-gitops {VERSION}\n", "")
