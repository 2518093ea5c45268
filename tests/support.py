"""What every test module shares: the repository root, the one way to run a command in-process (also
the `cli` fixture of conftest.py), and the CRD schemas made on first use.

The root is this checkout (the folder above tests/), not wherever an installed `generators` package
points, so a second clone tests its own files.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner, Result

REPO_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def crd_schemas() -> Path:
    """The kubeconform CRD schemas ($FSDP_GITOPS_CRD_SCHEMAS, else converted from the pinned Go modules
    on first use): only tests of the `gotools` tier call this, never at import time."""
    from generators.validation.schemas import default_crd_dir

    return default_crd_dir(REPO_ROOT)


def cli_run(command: click.Command, args: Sequence[object] = (), **kwargs: Any) -> Result:
    """Run a Click command in this process, as its script would run: `cli_run(main, [matrix, "--out", out])`.

    The arguments become strings; result.stdout and result.stderr are kept apart; keyword arguments go
    to CliRunner.invoke (e.g. catch_exceptions=False). Tests take it as the `cli` fixture (conftest.py).
    """
    return CliRunner().invoke(command, [str(a) for a in args], **kwargs)


def generated_copy(root: Path, matrix_text: str) -> Path:
    """A copy of the checkout's generators, trainer, base/ and pyproject.toml in git work tree `root`,
    with `matrix_text` as its matrix.yaml expanded by the copy's own generator: its overlays refer to the
    copy's base/, which a test may then edit."""
    import os
    import shutil
    import subprocess
    import sys

    for name in ("generators", "trainer", "base"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "matrix.yaml").write_text(matrix_text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(
        [sys.executable, str(root / "generators/expand.py"), str(root / "matrix.yaml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
        capture_output=True,
    )
    return root
