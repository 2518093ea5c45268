"""The README's quick start is what a new user runs, and what CI runs: two commands, word for word.

These tests hold the README, `.ci/run`, the pull-request workflow and the scripts behind the commands
to each other, and run the parts of the scripts that decide what a fresh machine gets (which Python,
root) for real.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
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


def _bin_with(tmp_path: Path, **links: str) -> Path:
    """A PATH folder holding only the named commands (name -> target)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, target in links.items():
        (folder / name).symlink_to(target)
    return folder


def _checkout_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    for name in ("python.sh", "test.sh"):
        (repo / "tools" / name).write_bytes((REPO_ROOT / "tools" / name).read_bytes())
    return repo


def test_without_a_python_command_the_setup_makes_a_venv_with_python3(tmp_path):
    """Debian and Ubuntu: python3 only, no `python`; the quick start makes .venv/ and uses it."""
    repo = _checkout_copy(tmp_path)
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    tools = {
        name: f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else f"/bin/{name}"
        for name in ("bash", "dirname")
    }
    path = _bin_with(tmp_path, python3=str(base), **tools)
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
    repo = _checkout_copy(tmp_path)
    venv = tmp_path / "mine"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    out = subprocess.run(["bash", "tools/python.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(venv / "bin" / "python")
    assert not (repo / ".venv").exists()


def test_the_test_command_as_a_user_without_root_or_sudo_stops_with_one_line(tmp_path):
    """Every tier runs or none: a user who cannot become root is told how, before anything is installed."""
    # Outside pytest's tmp_path, whose parents only root may enter.
    tmp_path = Path(tempfile.mkdtemp(prefix="fsdp-quickstart-", dir="/tmp"))
    tmp_path.chmod(0o755)
    repo = _checkout_copy(tmp_path)
    path = _bin_with(tmp_path, bash="/bin/bash", id="/usr/bin/id", dirname="/usr/bin/dirname")
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
