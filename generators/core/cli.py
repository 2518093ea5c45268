"""What the generator CLIs (expand.py, cluster.py, report.py) share: how they name paths, report bad
input (one line on stderr, exit 2, nothing written) and compare or write their generated files."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from generators import writer

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def matrix_label(path: str) -> str:
    """How generated banners name the matrix: relative to the repository root when inside it, so the
    bytes are the same whatever the working directory; otherwise the file name."""
    full = Path(path).resolve()
    try:
        label = full.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        label = full.name
    if not label.isascii():
        bad_input(f"{path}: MATRIX: the file name is not ASCII (generated files are ASCII only); "
                  "fix: rename the matrix file")
    return label


def display(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when below it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def bad_input(message: str) -> None:
    """One line on stderr and exit 2: the user's input (matrix or options) is wrong."""
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def output_dir(out: str | None, default: Path) -> Path:
    """The --out directory; a path that exists and is not a directory is bad input."""
    out_dir = Path(out) if out is not None else default
    if out_dir.exists() and not out_dir.is_dir():
        bad_input(f"--out {out}: is a file, not a directory; fix: pass a directory (or leave --out out)")
    return out_dir


def sync(out_dir: Path, files: dict[str, bytes], *, check: bool, generator: str, rerun: str,
         what: str) -> None:
    """Compare (--check: exit 1 naming each file that would change) or write the generated files.

    `what` says what the files are for, e.g. "for 30 runs"; `rerun` is the command that regenerates.
    """
    shown = display(out_dir)
    if check:
        changes = writer.compare(out_dir, files, generator=generator)
        for rel in changes.created:
            click.echo(f"missing: {shown}/{rel}")
        for rel in changes.updated:
            click.echo(f"differs: {shown}/{rel}")
        for rel in changes.deleted:
            click.echo(f"stale: {shown}/{rel}")
        if changes.all():
            click.echo(f"{len(changes.all())} generated files are out of date; run: {rerun}", err=True)
            sys.exit(EXIT_FAILURE)
        click.echo(f"{len(files)} generated files {what} are up to date", err=True)
        return
    try:
        changes = writer.write(out_dir, files, generator=generator)
    except OSError as err:
        click.echo(f"error: writing {shown}: {err}", err=True)
        sys.exit(EXIT_FAILURE)
    click.echo(f"{len(files)} files {what} under {shown}: {len(changes.created)} created, "
               f"{len(changes.updated)} updated, {len(changes.deleted)} stale deleted", err=True)
