"""Layers as entries (folders, files, links), written as deterministic uncompressed tars whose sha256
digest is computed while they are written: every mtime is EPOCH, owners are numeric, entries are sorted,
and the timestamp .pyc files get EPOCH as their source mtime so that Python keeps using them."""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tools.cluster.image.common import EPOCH, ImageError


@dataclass
class Entry:
    path: str  # inside the image, no leading slash
    kind: str  # "dir", "file" or "symlink"
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    data: bytes | None = None  # file content held in memory ...
    source: Path | None = None  # ... or read from this file
    target: str = ""  # symlink target


class _HashingWriter:
    """Writes to `out` and hashes what it wrote. Big files go in-kernel (copy_file_range) when `out`
    is a real file, and are hashed from a read-only mapping: no copy of their bytes passes through Python."""

    BIG = 1 << 20

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0
        try:
            self.fd: int | None = out.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.fd = None

    def write(self, data: bytes | memoryview) -> None:
        self.sha.update(data)
        self.out.write(data)
        self.size += len(data)

    def copy_file(self, path: Path, size: int) -> None:
        with open(path, "rb") as src:
            if self.fd is None or size < self.BIG:
                data = src.read(size)
                if len(data) != size:
                    raise ImageError(f"{path} changed size while it was packed")
                self.write(data)
                return
            with mmap.mmap(src.fileno(), size, access=mmap.ACCESS_READ) as mapped:
                self.sha.update(mapped)
            self.out.flush()
            done = 0
            while done < size:
                n = os.copy_file_range(src.fileno(), self.fd, size - done)
                if n == 0:
                    raise ImageError(f"{path} changed size while it was packed")
                done += n
            self.out.seek(0, os.SEEK_END)  # the buffered writer's position, after the in-kernel copy
            self.size += size


def pyc_header_fix(pyc: bytes, source: Path) -> bytes:
    """A timestamp .pyc that is valid for `source` gets the layers' EPOCH as its source mtime, so
    Python keeps using it in the image (every file there has mtime EPOCH); others stay as they are."""
    if len(pyc) < 16 or pyc[4:8] != b"\0\0\0\0":
        return pyc
    try:
        st = source.stat()
    except OSError:
        return pyc
    mtime, size = int.from_bytes(pyc[8:12], "little"), int.from_bytes(pyc[12:16], "little")
    if mtime != int(st.st_mtime) & 0xFFFFFFFF or size != st.st_size & 0xFFFFFFFF:
        return pyc
    return pyc[:8] + EPOCH.to_bytes(4, "little") + pyc[12:]


def _pyc_source(path: Path) -> Path | None:
    if path.suffix != ".pyc" or path.parent.name != "__pycache__":
        return None
    return path.parent.parent / (path.name.split(".", 1)[0] + ".py")


def write_layer(entries: Iterable[Entry], out: BinaryIO) -> tuple[str, int]:
    """Write `entries` (plus any missing parent folders) as one uncompressed tar; (sha256 digest, size)."""
    by_path: dict[str, Entry] = {}
    for e in entries:
        path = e.path.strip("/")
        parts = path.split("/")
        for i in range(1, len(parts)):
            by_path.setdefault("/".join(parts[:i]), Entry("/".join(parts[:i]), "dir"))
        if path in by_path and by_path[path].kind == "dir" and e.kind == "dir":
            continue
        by_path[path] = e
    writer = _HashingWriter(out)
    for path in sorted(by_path, key=lambda p: p.split("/")):
        e = by_path[path]
        info = tarfile.TarInfo(path + ("/" if e.kind == "dir" else ""))
        info.mtime, info.uid, info.gid, info.mode, info.uname, info.gname = EPOCH, e.uid, e.gid, e.mode, "", ""
        data = e.data
        if e.kind == "dir":
            info.type = tarfile.DIRTYPE
        elif e.kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, e.target
        elif data is None and e.source is not None:
            pyc_source = _pyc_source(e.source)
            if pyc_source is not None:
                data = pyc_header_fix(e.source.read_bytes(), pyc_source)
            else:
                info.size = e.source.stat().st_size
        if data is not None:
            info.size = len(data)
        writer.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        if info.type != tarfile.REGTYPE:
            continue
        if data is not None:
            writer.write(data)
        else:
            assert e.source is not None
            writer.copy_file(e.source, info.size)
        if info.size % 512:
            writer.write(b"\0" * (512 - info.size % 512))
    writer.write(b"\0" * 1024)
    return "sha256:" + writer.sha.hexdigest(), writer.size
