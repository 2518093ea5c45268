"""What the four commands (generators/expand.py, cluster.py, validate.py, report.py) share: how they
name paths, turn the generators' errors into exit codes and compare or write their generated files.

Errors become Click exceptions here and nowhere else: `InputError` -> one line `error: ...` on stderr
and exit 2 (`BadInput`); `ToolError` and a failed write -> one line and exit 1 (`Failure`). Click's
standalone mode does the exiting, so no module calls sys.exit.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from generators.core import checkout, outdir, records, writer
from generators.core.errors import InputError, ToolError

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


class BadInput(click.ClickException):
    """The user's input (a matrix, a results file or the options) is wrong: `error: ...`, exit 2."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class Failure(click.ClickException):
    """Something outside the input failed, or --check found changes: the message as is (nothing when
    empty: the command has printed what went wrong), exit 1."""

    exit_code = EXIT_FAILURE

    def show(self, file: IO[Any] | None = None) -> None:
        if self.format_message():
            click.echo(self.format_message(), err=True)


def errors_to_exit_codes(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate a command body: InputError -> BadInput (exit 2), ToolError -> Failure (exit 1). A console
    script started in another checkout than the installed one stops first (checkout.py)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            checkout.check_console_script()
            command(*args, **kwargs)
        except InputError as err:
            raise BadInput(str(err)) from None
        except ToolError as err:
            raise Failure(f"error: {err}") from None

    return wrapper


def matrix_label(path: str, repo_root: Path) -> str:
    """How generated banners name the matrix: relative to the repository root when inside it, so the
    bytes are the same whatever the working directory; otherwise the file name."""
    full = Path(path).resolve()
    try:
        label = full.relative_to(repo_root.resolve()).as_posix()
    except ValueError:
        label = full.name
    # The label is pasted into YAML and Markdown banners: a newline would inject YAML and `-->` would
    # close the Markdown banner's comment, so only the characters of ordinary paths pass.
    if not re.fullmatch(r"[A-Za-z0-9._+@=,/-]+", label) or "-->" in label:
        raise InputError(
            f"the file name {label!r} holds characters a generated banner cannot carry"
            " (letters, digits and . _ + @ = , / - only)",
            file=path,
            key="MATRIX",
            fix="rename the matrix file",
        )
    return label


# A path as the user would type it (relative to the working directory when below it).
display = records.display


def output_dir(out: str | None, default: Path, repo_root: Path, option: str = "--out") -> Path:
    """The `option` directory (--out, --plan-out); a file, a path below one, or a directory that holds
    the repository, is bad input."""
    out_dir = Path(out) if out is not None else default
    records.check_target(out_dir, repo_root, out if out is not None else display(out_dir), option)
    return out_dir


def owner(output: str, matrix: str, repo_root: Path) -> records.Owner:
    """Who writes an output: `output` (what the folder holds, e.g. "overlays") from the matrix file
    `matrix`, named relative to the repository when inside it, else by its absolute path."""
    full = Path(matrix).resolve()
    try:
        record = full.relative_to(repo_root.resolve()).as_posix()
    except ValueError:
        record = str(full)
    return records.Owner(output=output, matrix=record, label=matrix_label(matrix, repo_root))


@dataclass(frozen=True)
class Output:
    """One output directory of a command, with its files."""

    directory: Path
    files: Mapping[str, bytes]
    option: str = "--out"  # the option that names the directory (for messages)
    owner: records.Owner | None = None  # the header of its record (None: a record without one)


def _refuse_overlapping(targets: Sequence[Output]) -> None:
    """Two outputs of one command in the same folder, or one inside the other, would delete each other's files."""
    for i, a in enumerate(targets):
        for b in targets[i + 1 :]:
            ra, rb = Path(os.path.realpath(a.directory)), Path(os.path.realpath(b.directory))
            if ra == rb or ra in rb.parents or rb in ra.parents:
                how = "are the same folder" if ra == rb else "are one inside the other"
                raise InputError(
                    f"{a.option} {display(a.directory)} and {b.option} {display(b.directory)} {how}",
                    key=f"{a.option} and {b.option}",
                    fix=f"give {a.option} and {b.option} two separate folders, neither inside the other",
                )


def sync(
    out_dir: Path,
    files: Mapping[str, bytes],
    *,
    check: bool,
    generator: str,
    rerun: str,
    what: str,
    owner: records.Owner | None = None,
    more: Sequence[Output] = (),
) -> None:
    """Compare (--check: Failure naming each file that would change) or write the generated files.

    `what` says what the files are for, e.g. "for 30 runs"; `rerun` is the command that regenerates;
    `owner` goes into the record of out_dir (what it holds, from which matrix; cli.owner).
    `more` are further output directories of the same command (expand.py's plan document beside
    overlays/, each checked with output_dir first): compared together with out_dir; written after
    it, each directory all or nothing, once every one has been found to be the generator's own and
    none lies in another (so bad input changes nothing).
    """
    banner = writer.banner_prefix(generator).encode("ascii")
    targets = [Output(out_dir, files, "--out", owner), *more]
    _refuse_overlapping(targets)

    def compare(t: Output) -> outdir.Changes:
        return outdir.compare(
            t.directory,
            t.files,
            generator=generator,
            banner=banner,
            label=display(t.directory),
            owner=t.owner,
            option=t.option,
        )

    if check:
        differing = 0
        for t in targets:
            shown = display(t.directory)
            changes = compare(t)
            for rel in changes.created:
                click.echo(f"missing: {shown}/{rel}")
            for rel in changes.updated:
                click.echo(f"differs: {shown}/{rel}")
            for rel in changes.deleted:
                click.echo(f"stale: {shown}/{rel}")
            differing += len(changes.all())
        if differing:
            raise Failure(f"{differing} generated files are out of date; run: {rerun}")
        click.echo(f"{sum(len(t.files) for t in targets)} generated files {what} are up to date", err=True)
        return
    for t in targets:  # every output refused or accepted before the first is written
        outdir.refuse(
            t.directory,
            t.files,
            generator=generator,
            banner=banner,
            label=display(t.directory),
            owner=t.owner,
            option=t.option,
        )
    for t in targets:
        shown = display(t.directory)
        try:
            changes = outdir.write(
                t.directory, t.files, generator=generator, banner=banner, label=shown, owner=t.owner, option=t.option
            )
        except OSError as err:
            raise Failure(f"error: writing {shown}: {err}") from None
        click.echo(
            f"{len(t.files)} files {what} under {shown}: {len(changes.created)} created, "
            f"{len(changes.updated)} updated, {len(changes.deleted)} stale deleted",
            err=True,
        )


def project_version() -> str:
    """fsdp-gitops's version: pyproject.toml's, the one source (read from the checkout, so a command
    run as `python generators/<command>.py` from a clone that was never installed knows it too)."""
    import tomllib

    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def version_option() -> Callable[[Any], Any]:
    """`--version` for every command: `fsdp-gitops 0.1.0`."""
    return click.version_option(project_version(), "--version", prog_name="fsdp-gitops", message="%(prog)s %(version)s")
