"""The OCI image layout packed as one tar with uncompressed layers, the form `ctr images import` reads:
written in one pass (a layer written before is copied in-kernel from its archive, a new one is written
straight in), read back, unpacked into a folder, and cut down to a delta without the blobs a containerd
content store already holds."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tools.cluster.image.common import EPOCH, Image, ImageError, sha
from tools.cluster.image.layers import Entry, write_layer


@dataclass(frozen=True)
class Layer:
    """A layer's bytes already written: `size` bytes at `offset` in the file `path` (an archive)."""

    path: Path
    digest: str
    size: int
    offset: int = 0


def _blob_header(digest: str, size: int) -> bytes:
    # GNU format: one 512-byte block whatever the size (base-256 beyond 8 GiB), so a placeholder
    # header can be overwritten in place once the layer's digest and size are known.
    info = tarfile.TarInfo(f"blobs/sha256/{digest.split(':', 1)[1]}")
    info.size, info.mtime, info.mode, info.uname, info.gname = size, EPOCH, 0o644, "", ""
    header = info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    assert len(header) == 512
    return header


def _pad(out: BinaryIO, size: int) -> None:
    if size % 512:
        out.write(b"\0" * (512 - size % 512))


def _copy_range(out: BinaryIO, layer: Layer) -> None:
    out.flush()
    with open(layer.path, "rb") as src:
        done = 0
        while done < layer.size:
            n = os.copy_file_range(src.fileno(), out.fileno(), layer.size - done, layer.offset + done)
            if n == 0:
                raise ImageError(f"{layer.path} is shorter than its recorded layers")
            done += n
    out.seek(0, os.SEEK_END)  # the buffered writer's position, after the in-kernel copy


def write_archive(
    out: BinaryIO, name: str, layers: list[Layer | Callable[[], list[Entry]]], config: dict[str, Any]
) -> tuple[str, list[Layer]]:
    """The OCI image layout (blobs/sha256/..., index.json, oci-layout) as one tar, in one pass: a layer
    given as a `Layer` is copied in-kernel from where it was written before, one given as a function
    returning entries is written straight into the archive (its header patched once its digest is
    known). Returns the manifest digest and each layer's place in `out` (path left empty)."""
    for dirname in ("blobs/", "blobs/sha256/"):
        info = tarfile.TarInfo(dirname)
        info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o755, EPOCH, "", ""
        out.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
    placed: list[Layer] = []
    for layer in layers:
        header_at = out.tell()
        if isinstance(layer, Layer):
            out.write(_blob_header(layer.digest, layer.size))
            _copy_range(out, layer)
            digest, size = layer.digest, layer.size
        else:
            out.write(_blob_header("sha256:" + "0" * 64, 0))
            digest, size = write_layer(layer(), out)
            out.seek(header_at)
            out.write(_blob_header(digest, size))
            out.seek(0, os.SEEK_END)
        _pad(out, size)
        if any(p.digest == digest for p in placed):
            raise ImageError(f"two layers of {name} have the same content ({digest})")
        placed.append(Layer(Path(), digest, size, header_at + 512))
    config = {**config, "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in placed]}}
    config_blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": "sha256:" + sha(config_blob),
            "size": len(config_blob),
        },
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.digest, "size": layer.size}
            for layer in placed
        ],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + sha(manifest_blob)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    small = {
        f"blobs/sha256/{sha(config_blob)}": config_blob,
        f"blobs/sha256/{digest[7:]}": manifest_blob,
        "index.json": json.dumps(index, sort_keys=True, indent=1).encode(),
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
    }
    for member, data in small.items():
        info = tarfile.TarInfo(member)
        info.size, info.mtime, info.mode, info.uname, info.gname = len(data), EPOCH, 0o644, "", ""
        out.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
        out.write(data)
        _pad(out, len(data))
    out.write(b"\0" * 1024)
    return digest, placed


def read_archive(archive: Path) -> dict[str, Any]:
    """index, manifest, config and each layer's member name, from an archive write_archive wrote."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            f = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert f is not None
            return f.read()

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
    return {"index": index, "manifest": manifest, "config": config}


def unpack(archive: Path, dest: Path) -> None:
    """Extract the image's layers in order into `dest` (owners kept when run as root)."""
    dest.mkdir(parents=True, exist_ok=True)
    info = read_archive(archive)
    with tarfile.open(archive) as tar:
        for layer in info["manifest"]["layers"]:
            f = tar.extractfile(f"blobs/sha256/{layer['digest'].split(':', 1)[1]}")
            assert f is not None
            with tarfile.open(fileobj=f, mode="r:") as inner:
                inner.extractall(dest, numeric_owner=True, filter="fully_trusted")


def delta_archive(img: Image, present: Iterable[str]) -> Path:
    """`img`'s archive without the layer blobs whose digests are in `present` (what a containerd
    content store already holds, e.g. `ctr content ls -q`). `ctr images import` of it registers the
    same image (name, manifest digest) and unpacks it from the blobs the store has; it matters because
    ctr streams every blob of an archive into the store before it finds the blob already there, so
    re-importing a trainer image whose code layer alone changed would copy gigabytes again.
    Cached beside the archive; returns the archive itself when nothing is left out."""
    layers = {la["digest"] for la in read_archive(img.archive)["manifest"]["layers"]}
    skip = sorted(layers & set(present))
    if not skip:
        return img.archive
    path = img.archive.with_name(f"delta-{sha(' '.join(skip))[:16]}.tar")
    if path.is_file():
        return path
    skipped = {f"blobs/sha256/{d.split(':', 1)[1]}" for d in skip}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(img.archive) as tar, open(tmp, "wb") as out:
            for member in tar.getmembers():
                if member.name in skipped:
                    continue
                end = member.offset_data + (member.size + 511) // 512 * 512 if member.isfile() else member.offset_data
                _copy_range(out, Layer(img.archive, "", end - member.offset, member.offset))
            out.write(b"\0" * 1024)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
