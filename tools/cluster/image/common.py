"""What every part of the image builder shares: the Image it returns, its error, the constants of every
layer (the epoch, the registry, the Python minor version) and the cache folder with its small helpers."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tools.cluster import build

REPO_ROOT = Path(__file__).resolve().parents[3]
REGISTRY = "localhost/fsdp-gitops"  # image names: <REGISTRY>/<kind>:test-<key>; nothing is ever pulled
EPOCH = 0  # the mtime of every file in every layer (deterministic layers; the .pyc headers are set to match)
PYTHON = "3.11"  # Debian 12's python3.11; the environment packed into /opt/venv must be the same minor version


class ImageError(RuntimeError):
    """An image could not be built (a missing Debian package, a pin the environment does not hold, ...)."""


@dataclass(frozen=True)
class Image:
    archive: Path  # OCI layout in one tar (uncompressed layers); `ctr images import` reads it
    name: str  # e.g. localhost/fsdp-gitops/trainer:test-0123456789ab
    digest: str  # sha256:<hex> of the image manifest

    @property
    def repository(self) -> str:
        return self.name.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.name.rsplit(":", 1)[1]


def canonical(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503: runs of -_. as one -, lower case)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def images_dir() -> Path:
    """Where layer records, archives and the apt memo live: build.cache_root()/images."""
    return build.cache_root() / "images"


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` under a temporary name and rename it over `path`: readers see all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
