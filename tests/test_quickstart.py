"""The README's quick start is what a new user runs, and what CI runs: two commands, word for word.

These tests hold the README, `.ci/run`, the pull-request workflow and the scripts behind the commands
to each other, and run the parts of the scripts that decide what a fresh machine gets (which Python)
for real. The test command as a user without root (root drops to that user):
tests/cluster/test_quickstart_without_root.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from quickstart_support import bin_with, checkout_copy
from support import REPO_ROOT

MAIN = "python generators/expand.py matrix.yaml"
TEST = "bash tools/test.sh"


def quickstart_commands() -> list[str]:
    """The commands of the README's quick-start block, comments stripped."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md's quick start has no ```bash block"
    return [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_quick_start_is_two_commands_the_main_job_and_the_tests():
    first, second, *rest = quickstart_commands()
    assert not rest, f"the quick start has {2 + len(rest)} commands, not two"
    assert first.endswith(MAIN) and first.startswith(". tools/activate.sh"), first
    assert second == TEST


def test_ci_run_only_calls_the_readme_test_command():
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".ci/run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    commands = [line for line in lines if line not in ("set -euo pipefail",) and not line.startswith("cd ")]
    assert commands == [f"exec {TEST}"], commands
    assert not re.search(r"apt-get|pip |go install", (REPO_ROOT / ".ci/run").read_text())


def test_the_pull_request_workflow_runs_the_readme_commands_and_nothing_else():
    workflow = yaml.safe_load((REPO_ROOT / ".github/workflows/ci.yaml").read_text())
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as True
    steps = workflow["jobs"]["check"]["steps"]
    runs = [step["run"] for step in steps if "run" in step]
    first, second = quickstart_commands()
    # The test command first (it checks the committed generated files), then the main command, which
    # must leave the committed tree as it is.
    assert runs[0].strip() == second
    main_lines = [line.strip() for line in runs[1].splitlines() if not line.strip().startswith("#")]
    assert main_lines[0] == first
    assert main_lines[1].startswith("git diff --exit-code")
    assert len(runs) == 2, "a workflow step that is not a README command: put it in tools/test.sh"
    # Every other step only sets up the toolchains the README assumes (Python and Go).
    uses = [step["uses"].split("@")[0] for step in steps if "uses" in step]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/setup-go"]


def test_without_a_python_command_the_setup_makes_a_venv_with_python3(tmp_path):
    """Debian and Ubuntu: python3 only, no `python`; the quick start makes .venv/ and uses it."""
    repo = checkout_copy(tmp_path)
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    tools = {
        name: f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else f"/bin/{name}"
        for name in ("bash", "dirname")
    }
    path = bin_with(tmp_path, python3=str(base), **tools)
    env = {"PATH": str(path), "HOME": str(tmp_path)}
    first = subprocess.run(["bash", "tools/python.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    venv_python = repo / ".venv" / "bin" / "python"
    assert first.stdout.strip() == str(venv_python)
    assert "PEP 668" in first.stderr
    assert subprocess.run([venv_python, "-m", "pip", "--version"], capture_output=True).returncode == 0
    # The next command finds it again instead of making another.
    again = subprocess.run(["bash", "tools/python.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert again.stdout.strip() == str(venv_python) and again.stderr == ""


def test_an_active_virtualenv_is_used_as_it_is(tmp_path):
    repo = checkout_copy(tmp_path)
    venv = tmp_path / "mine"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    out = subprocess.run(["bash", "tools/python.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(venv / "bin" / "python")
    assert not (repo / ".venv").exists()


def test_the_debian_packages_the_tests_build_against_are_listed_and_installed_by_the_setup():
    listed = [
        line.split("#")[0].strip()
        for line in (REPO_ROOT / "requirements/debian.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    assert "libseccomp-dev" in listed  # runc's seccomp tag (tools/cluster/build.py)
    setup = (REPO_ROOT / "tools/setup.sh").read_text()
    assert 'bash "$root/tools/debian.sh"' in setup.split('if [ "${1:-}" = "test" ]; then', 1)[1]


def test_every_listed_debian_package_is_installed_here():
    """What the test command installed is really there (dpkg's own word), so the list is the truth."""
    listed = [
        line.split("#")[0].strip()
        for line in (REPO_ROOT / "requirements/debian.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    for package in listed:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
        assert status.stdout == "install ok installed", f"{package}: {status.stdout or status.stderr}"
