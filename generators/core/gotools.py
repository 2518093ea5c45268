"""Where the pinned Go tools (kustomize, kubeconform, age, actionlint) are found.

`bash tools/setup.sh test` builds them from tools/go.mod into <repo>/.tools/bin; that copy wins over
anything on PATH so the pinned versions are the ones used.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from generators.core.errors import ToolError

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"


def tool(name: str) -> str:
    """Absolute path of the Go tool `name`: <repo>/.tools/bin first, then PATH."""
    local = TOOLS_BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    raise ToolError(
        f"{name} not found in {TOOLS_BIN} or on PATH; install the pinned tools with `bash tools/setup.sh test`"
    )
