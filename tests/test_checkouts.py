"""Two clones of the repository and one virtual environment: each clone's `python generators/<command>.py`
runs that clone's code, even with the other clone installed in the environment (`pip install -e`, as
tools/setup.sh does), and still runs once the installed clone is gone; a console script (fsdp-expand)
started in the other clone stops in one line naming both checkouts and the fix.

The environment is a real venv created here; the repository's dependencies reach it through a .pth
file naming this interpreter's site-packages, and clone A is installed into it by pip in editable
mode. Clone B differs from A in one line of a package module (the generated files' banner), so the
output tells which clone's code wrote it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support import REPO_ROOT

# git clones, a venv and an editable install by pip: seconds.
pytestmark = pytest.mark.slow

MARKER = "Do not edit by hand (clone b):"


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def banners(out: Path) -> set[str]:
    """The first line of every generated YAML file under `out`."""
    return {p.read_text().splitlines()[0] for p in out.rglob("*.yaml")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(clone a, clone b, the venv's python) with clone a installed editable into the venv."""
    tmp = tmp_path_factory.mktemp("checkouts")
    a, b = tmp / "a", tmp / "b"
    for clone in (a, b):
        subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True, capture_output=True)
    writer = b / "generators" / "core" / "writer.py"
    text = writer.read_text()
    assert text.count("Do not edit by hand:") == 2  # the YAML banner and the Markdown one
    writer.write_text(text.replace("Do not edit by hand:", MARKER))

    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp).stdout.strip())
    # A .pth line adds a folder to sys.path without running the .pth files in it (so not this
    # interpreter's own editable install of the repository).
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = run(
        python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", a, cwd=tmp
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return a, b, python


def test_the_environment_imports_clone_a(setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    a, _, python = setup
    where = run(python, "-c", "import generators; print(generators.__file__)", cwd=tmp_path)
    assert where.stdout.strip() == str(a / "generators" / "__init__.py"), where.stdout + where.stderr
    # The console scripts keep working: they run the installed clone.
    listed = run(python.parent / "fsdp-expand", "matrix.yaml", "--list", cwd=a)
    assert listed.returncode == 0 and "llama2-7b" in listed.stdout, listed.stdout + listed.stderr


def test_a_console_script_started_in_the_other_clone_stops_naming_both(setup: tuple[Path, Path, Path]) -> None:
    a, b, python = setup
    out = b / "overlays"
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    result = run(python.parent / "fsdp-expand", "matrix.yaml", cwd=b)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert f"runs the code of {a}" in line and f"in the checkout {b}" in line, line
    assert f"python generators/expand.py` in {b}" in line, line
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert run("git", "status", "--porcelain", cwd=a).stdout == ""  # nothing written into clone A either


def test_each_clone_generates_with_its_own_code(setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    a, b, python = setup
    for clone in (a, b):
        out = tmp_path / clone.name
        result = run(python, clone / "generators" / "expand.py", "matrix.yaml", "--out", out, cwd=clone)
        assert result.returncode == 0, result.stdout + result.stderr
    assert not any(MARKER in line for line in banners(tmp_path / "a"))
    assert all(MARKER in line for line in banners(tmp_path / "b")), banners(tmp_path / "b")
    # The other commands too: B's cluster definitions carry B's banner.
    cluster = run(python, b / "generators" / "cluster.py", "matrix.yaml", "--out", tmp_path / "eks", cwd=b)
    assert cluster.returncode == 0, cluster.stdout + cluster.stderr
    assert all(MARKER in line for line in banners(tmp_path / "eks")), banners(tmp_path / "eks")


def test_a_clone_runs_after_the_installed_clone_is_gone(setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    a, b, python = setup
    shutil.rmtree(a)
    result = run(python, b / "generators" / "expand.py", "matrix.yaml", "--out", tmp_path / "o", cwd=b)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(MARKER in line for line in banners(tmp_path / "o"))
