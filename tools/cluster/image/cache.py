"""The image cache: every layer and archive keyed by the sha256 of all its inputs (the builder's own
source among them), built under a lock, written under a temporary name and renamed, and pruned to the
newest KEEP archives of each kind.

Layers live inside the archives: build.cache_root()/images/layers/<name>-<key>.json records where a
layer was written (archive, offset, size, digest), so the next archive that needs it copies those bytes
in-kernel instead of building them again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.cluster import build
from tools.cluster.image.archive import Layer, write_archive
from tools.cluster.image.common import REGISTRY, Image, ImageError, atomic_write, images_dir, sha
from tools.cluster.image.layers import Entry


def builder_source() -> str:
    """The hash of every module of the image builder (sorted by name, each by its content): a change to
    any of them keys every layer and image anew."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f"{path.name}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


@contextlib.contextmanager
def lock() -> Iterator[None]:
    images_dir().mkdir(parents=True, exist_ok=True)
    with open(images_dir() / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another session may be building the same image
        yield


@dataclass(frozen=True)
class LayerSpec:
    name: str  # base, stdlib, venv, code, pause
    key: str  # sha256 of every input
    make: Callable[[], list[Entry]]


KEEP = 2  # archives kept per image kind (the newest); older ones, and the layer records pointing into them, go


def _prune(kind: str) -> None:
    """Remove all but the KEEP newest archives of `kind` and the layer records that point into removed
    archives (under the lock: no build is running). A trainer archive is gigabytes, and every change to
    trainer/ makes one."""
    images = images_dir()
    kept = sorted(images.glob(f"{kind}-*/image.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for meta in kept[KEEP:]:
        shutil.rmtree(meta.parent, ignore_errors=True)
    for folder in images.glob(f"{kind}-*"):
        if not (folder / "image.json").exists():  # a build that failed (no build runs: we hold the lock)
            shutil.rmtree(folder, ignore_errors=True)
    for stale in (images / "layers").glob("*.tar"):  # layer files of an earlier layout
        stale.unlink(missing_ok=True)
    for record in (images / "layers").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if not Path(json.loads(record.read_text())["path"]).is_file():
                record.unlink()


def cached_layer(spec: LayerSpec) -> Layer | None:
    """Where the layer of `spec` was written before (inside an archive), if that archive is still there."""
    record = images_dir() / "layers" / f"{spec.name}-{spec.key[:24]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads(record.read_text())
        layer = Layer(Path(info["path"]), info["digest"], info["size"], info["offset"])
        if layer.path.is_file() and layer.path.stat().st_size >= layer.offset + layer.size:
            return layer
    return None


def cached_image(kind: str, specs: list[LayerSpec], config: dict[str, Any]) -> Image:
    """The image of `kind` made of `specs`, named <REGISTRY>/<kind>:test-<key>: found by its key, or built."""
    key = sha(json.dumps([builder_source(), kind, [(s.name, s.key) for s in specs], config], sort_keys=True))
    folder = images_dir() / f"{kind}-{key[:24]}"
    meta = folder / "image.json"
    if not meta.is_file():
        with lock():
            if not meta.is_file():
                _build(kind, key, specs, config, folder)
    info = json.loads(meta.read_text())
    return Image(folder / "image.tar", info["name"], info["digest"])


def _build(kind: str, key: str, specs: list[LayerSpec], config: dict[str, Any], folder: Path) -> None:
    started = time.monotonic()
    name = f"{REGISTRY}/{kind}:test-{key[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "image.tar"
    tmp = folder / f".image.tar.{os.getpid()}.tmp"
    sources: list[Layer | Callable[[], list[Entry]]] = []
    for spec in specs:
        cached = cached_layer(spec)
        sources.append(cached if cached is not None else spec.make)
    try:
        # The trainer image's layers take minutes to build and write on a cold machine.
        with build.progress(f"image: {kind}"), open(tmp, "wb") as out:
            digest, placed = write_archive(out, name, sources, config)
        os.replace(tmp, archive)
    except OSError as e:
        raise ImageError(f"writing {archive}: {e.strerror or e} (the trainer archive needs about 5 GB)") from e
    finally:
        tmp.unlink(missing_ok=True)
    for spec, source, layer in zip(specs, sources, placed, strict=True):
        # Every layer record points into the newest archive, which is the last to be pruned.
        record = {"path": str(archive), "digest": layer.digest, "size": layer.size, "offset": layer.offset}
        atomic_write(images_dir() / "layers" / f"{spec.name}-{spec.key[:24]}.json", json.dumps(record).encode())
        how = "copied" if isinstance(source, Layer) else "built"
        print(f"image layer {spec.name}: {layer.size / 1e6:.1f} MB, {how}", file=sys.stderr, flush=True)
    atomic_write(folder / "image.json", json.dumps({"name": name, "digest": digest}).encode())
    _prune(kind)
    size = archive.stat().st_size
    print(f"image {name}: {size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
