"""The output directory of a generator: an all-or-nothing way to change it (what it owns there, and
which writes are refused, is generators/core/records.py).

All or nothing. `write` builds the complete new tree beside the output (`.<out>.writing-<pid>`:
unchanged and foreign files hard-linked, new files written, the file system synced), then exchanges
it with the output in one atomic rename (renameat2 RENAME_EXCHANGE on Linux) and removes the old tree.
A SIGKILL, a full disk or an I/O error at any moment leaves the output exactly as it was or exactly as
the new output says; what a killed write left beside it is removed by the next one. Two writers of the
same output take turns (an exclusive lock: in the git directory when the output is in a work tree, so
nested outputs such as overlays/ and overlays/provisioning/ take turns too, else beside the output).

A mount point as the output (a container's volume, a tmpfs) cannot be renamed, and a tree built
beside it is on another file system. There the new tree is built inside it, in a hidden folder
`.fsdp-gitops.writing-<pid>` (hard links work within the mount), and each top-level entry the write
changes is exchanged with its new version, one atomic rename each, the record last (entries it does
not change, such as a file system's lost+found, stay as they are). Before the first exchange
the record is replaced by one listing the old and the new files, so a write killed between two
exchanges leaves a mix of old and new entries that the next write owns completely and repairs; the
hidden folder it left is removed then. So at a mount point each top-level entry is old or new, and
the whole is exactly old or new again after the next successful write. Its lock is a hidden file
inside it (`.fsdp-gitops.lock`, never part of the output), so a read-only parent does not matter.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from generators.core.records import (
    INSIDE_WRITING,
    LOCK_SUFFIX,
    Owner,
    manifest_name,
    owned_files,
    record_bytes,
    scan,
)

_WRITING = ".writing-"
_REPLACED = ".replaced-"


@dataclass
class Changes:
    """Relative paths (posix) under the output directory."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return sorted(self.created + self.updated + self.deleted)


def refuse(
    out_dir: Path,
    expected: Mapping[str, bytes],
    *,
    generator: str,
    banner: bytes,
    label: str = "",
    owner: Owner | None = None,
    option: str = "--out",
) -> None:
    """InputError where `write` would refuse (generators/core/records.py); reads records and banners,
    never the whole of a file."""
    owned_files(out_dir, generator, banner, label or str(out_dir), expected=expected, owner=owner, option=option)


def compare(
    out_dir: Path,
    expected: Mapping[str, bytes],
    *,
    generator: str,
    banner: bytes,
    label: str = "",
    owner: Owner | None = None,
    option: str = "--out",
) -> Changes:
    """What `write` would change among the generated files (the record aside); InputError where
    `write` would refuse."""
    changes = Changes()
    existing = scan(Path(os.path.realpath(out_dir)))
    owned = owned_files(
        out_dir,
        generator,
        banner,
        label or str(out_dir),
        expected=expected,
        owner=owner,
        option=option,
        existing=existing,
    )
    for rel, data in expected.items():
        path = existing.get(rel)
        if path is None:
            changes.created.append(rel)
        elif path.read_bytes() != data:
            changes.updated.append(rel)
    changes.deleted = sorted(rel for rel in owned if rel not in expected and rel != manifest_name(generator))
    changes.created.sort()
    changes.updated.sort()
    return changes


def _lock_path(out_dir: Path) -> Path:
    for d in (out_dir, *out_dir.parents):
        if (d / ".git").is_dir():
            return d / ".git" / "fsdp-gitops-generators.lock"
    if out_dir.is_dir() and _is_mount_point(out_dir):
        return out_dir / LOCK_SUFFIX  # a mount point's parent may be read-only (a container's /)
    return out_dir.parent / f".{out_dir.name}{LOCK_SUFFIX}"


@contextmanager
def _locked(out_dir: Path, label: str) -> Iterator[None]:
    path = _lock_path(out_dir)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting: another generator is writing near {label} (lock {path})", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock (so does the death of the process)


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the system cannot (then the caller renames twice)."""
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _sync(path: Path) -> None:
    """Flush the file system holding `path` (one syncfs instead of an fsync per file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        syncfs = getattr(_libc, "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _remove_leftovers(parent: Path, name: str) -> None:
    """Trees a killed write left beside the output (or, at a mount point, inside it)."""
    stale_trees = [*parent.glob(f".{name}{_WRITING}*"), *parent.glob(f".{name}{_REPLACED}*")]
    inside = parent / name
    if inside.is_dir():
        stale_trees += inside.glob(INSIDE_WRITING + "*")
    for stale in stale_trees:
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _is_mount_point(path: Path) -> bool:
    """A mount point, bind mounts of a folder of the same file system included (os.path.ismount sees
    only a change of device)."""
    if os.path.ismount(path):
        return True
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            return any(
                len(fields) > 4 and _unescape_mountinfo(fields[4]) == str(path)
                for fields in (line.split(" ") for line in fh)
            )
    except OSError:
        return False


def _build(tmp: Path, out_dir: Path, files: Mapping[str, bytes], drop: set[str]) -> None:
    """The new tree in tmp: what out_dir holds (hard links) less `drop`, plus `files`."""
    had_content: set[str] = set()
    if out_dir.is_dir():
        for root, dirs, names in os.walk(out_dir):
            if root == str(out_dir):
                dirs[:] = [d for d in dirs if not d.startswith(INSIDE_WRITING)]
            rel_root = os.path.relpath(root, out_dir)
            target_root = tmp if rel_root == "." else tmp / rel_root
            for d in dirs:
                src = Path(root) / d
                if src.is_symlink():
                    os.symlink(os.readlink(src), target_root / d)
                else:
                    (target_root / d).mkdir(mode=src.stat().st_mode & 0o7777)
            if names or dirs:
                had_content.add(rel_root)
            for n in names:
                rel = n if rel_root == "." else f"{Path(rel_root).as_posix()}/{n}"
                if rel in drop or rel in files:
                    continue
                src = Path(root) / n
                if src.is_symlink():
                    os.symlink(os.readlink(src), target_root / n)
                else:
                    try:
                        os.link(src, target_root / n)
                    except OSError:
                        shutil.copy2(src, target_root / n)
    for rel, data in files.items():
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as fh:
            fh.write(data)
    # Directories left empty by the deletions go; directories that were empty already stay.
    for rel in sorted(had_content, key=lambda r: -len(Path(r).parts)):
        emptied = tmp / rel
        if rel != "." and emptied.is_dir() and not emptied.is_symlink() and not any(emptied.iterdir()):
            emptied.rmdir()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_file(a: Path, b: Path) -> bool:
    sa, sb = os.lstat(a), os.lstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _swap_entries(tmp: Path, out_dir: Path, manifest: str, transition: bytes, changes: Changes) -> None:
    """At a mount point: make out_dir's entries those of tmp (built inside it), one atomic rename each,
    the record last; until then the record lists the old and the new files (the module docstring).
    Entries the write does not change stay as they are (a file system's lost+found among them)."""
    staged = tmp / (INSIDE_WRITING + "record")
    staged.write_bytes(transition)
    os.replace(staged, out_dir / manifest)
    _fsync_dir(out_dir)
    trash = tmp / (INSIDE_WRITING + "old")  # where old entries go when no exchange is possible
    touched = {rel.split("/", 1)[0] for rel in changes.all()}
    for n in sorted(touched - {manifest}):
        new, old = tmp / n, out_dir / n
        if not os.path.lexists(old):
            os.rename(new, old)
        elif not os.path.lexists(new):
            os.rename(old, new)  # gone from the new tree: into tmp, removed with it
        elif _same_file(new, old):
            continue
        elif not _exchange(new, old):
            trash.mkdir(exist_ok=True)
            os.rename(old, trash / n)
            os.rename(new, old)
    os.replace(tmp / manifest, out_dir / manifest)
    _fsync_dir(out_dir)


def write(
    out_dir: Path,
    expected: Mapping[str, bytes],
    *,
    generator: str,
    banner: bytes,
    label: str = "",
    owner: Owner | None = None,
    option: str = "--out",
) -> Changes:
    """Make out_dir hold `expected` (and the record) in one atomic step; returns what changed.
    InputError, before anything is written, where generators/core/records.py refuses the write."""
    label = label or str(out_dir)
    # Refused before the parent folders or the lock are created; again under the lock below.
    refuse(out_dir, expected, generator=generator, banner=banner, label=label, owner=owner, option=option)
    out_dir = Path(os.path.realpath(out_dir))
    parent, name = out_dir.parent, out_dir.name
    parent.mkdir(parents=True, exist_ok=True)
    with _locked(out_dir, label):
        _remove_leftovers(parent, name)
        # Another writer may have gone first.
        changes = compare(
            out_dir, expected, generator=generator, banner=banner, label=label, owner=owner, option=option
        )
        manifest = manifest_name(generator)
        files = {**expected, manifest: record_bytes(generator, expected, owner)}
        current = out_dir / manifest
        if not changes.all() and current.is_file() and current.read_bytes() == files[manifest]:
            return changes
        mount_point = out_dir.is_dir() and _is_mount_point(out_dir)
        if mount_point:
            tmp = out_dir / f"{INSIDE_WRITING}{os.getpid()}"
        else:
            tmp = parent / f".{name}{_WRITING}{os.getpid()}"
        try:
            tmp.mkdir(mode=(out_dir.stat().st_mode & 0o7777) if out_dir.is_dir() else 0o755)
            _build(tmp, out_dir, files, set(changes.deleted) | {manifest})
            _sync(tmp)
            if mount_point:
                # Until the last swap the record owns the files going as well as the new ones.
                transition = record_bytes(generator, set(expected) | set(changes.deleted), owner)
                _swap_entries(tmp, out_dir, manifest, transition, changes)
            elif not out_dir.exists():
                os.rename(tmp, out_dir)
            elif _exchange(tmp, out_dir):
                pass  # tmp now holds the old tree
            else:
                # No atomic exchange here: two renames (the output is missing only between them).
                old = parent / f".{name}{_REPLACED}{os.getpid()}"
                os.rename(out_dir, old)
                os.rename(tmp, out_dir)
                tmp = old
            if not mount_point:
                _fsync_dir(parent)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return changes
