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
