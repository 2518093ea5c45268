"""What every test module shares: the repository root, and the CRD schemas made on first use.

The root is this checkout (the folder above tests/), not wherever an installed `generators` package
points, so a second clone tests its own files.
"""

from __future__ import annotations

import functools
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def crd_schemas() -> Path:
    """The kubeconform CRD schemas ($FSDP_GITOPS_CRD_SCHEMAS, else converted from the pinned Go modules
    on first use): only tests of the `gotools` tier call this, never at import time."""
    from generators.validation.schemas import default_crd_dir

    return default_crd_dir(REPO_ROOT)
