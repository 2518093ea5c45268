"""Which checkout a command's code comes from.

`python generators/<command>.py` always runs the packages of the checkout the script is in (each
command puts that checkout first on the import path). The console scripts (fsdp-expand, fsdp-cluster,
fsdp-validate, fsdp-report, fsdp-status) run the checkout installed with `pip install -e`; started inside another
checkout of the repository they would read that checkout's matrix with the installed checkout's code
and write into the installed checkout's overlays/, so they stop instead, in one line naming both.
"""

from __future__ import annotations

import sys
from pathlib import Path

from generators.core.errors import InputError

# The checkout (or installed tree) these modules were imported from.
CODE_ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPTS = ("fsdp-expand", "fsdp-cluster", "fsdp-validate", "fsdp-report", "fsdp-status")


def checkout_of(path: Path) -> Path | None:
    """The checkout of this repository that holds `path` (its generators/ and pyproject.toml), or None."""
    for folder in (path, *path.parents):
        if (folder / "generators" / "expand.py").is_file() and (folder / "pyproject.toml").is_file():
            return folder
    return None


def check_console_script(argv0: str | None = None, cwd: Path | None = None) -> None:
    """InputError when a console script runs another checkout's code than the one it was started in."""
    script = Path(argv0 if argv0 is not None else sys.argv[0]).name
    if script not in CONSOLE_SCRIPTS:
        return  # `python generators/<command>.py`, or a test calling the command: nothing to check
    here = checkout_of((cwd or Path.cwd()).resolve())
    if here is None or here == CODE_ROOT:
        return
    command = script.removeprefix("fsdp-")
    raise InputError(
        f"{script} runs the code of {CODE_ROOT} (installed), but the working directory is in the checkout {here}",
        fix=f"run `python generators/{command}.py` in {here}, or install it with `pip install -e {here}`",
    )
