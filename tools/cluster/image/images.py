"""The three images of the real-pods level: the trainer test image (docker/Dockerfile's final stage on
Debian packages, /opt/venv and trainer/), the utility image (the base layer alone, for init containers)
and the pause image (the sandbox); and the command line that builds or prints them
(`python -m tools.cluster.image`)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from tools.cluster import build
from tools.cluster.image.archive import read_archive, unpack
from tools.cluster.image.cache import LayerSpec, builder_source, cached_image
from tools.cluster.image.common import Image, ImageError, sha
from tools.cluster.image.debs import BASE_PACKAGES, STDLIB_PACKAGES, base_layer, resolve_debs, stdlib_layer
from tools.cluster.image.dockerfile import BASE_ENV, DockerfileConfig, dockerfile_config
from tools.cluster.image.layers import Entry
from tools.cluster.image.python import code_entries, context_files, venv_inputs, venv_layer

USAGE = """usage:
    python -m tools.cluster.image            # build (or find) all three, print "<name> <digest> <archive>"
    python -m tools.cluster.image --print    # the trainer image: name, digest, config, layers (JSON)
    python -m tools.cluster.image --unpack DIR   # the trainer image's file system into DIR (for chroot)
"""


def image_config(
    user: str, env: dict[str, str], workdir: str, entrypoint: list[str] | None, cmd: list[str] | None
) -> dict[str, Any]:
    """An OCI image config (without rootfs, which write_archive adds) at the epoch, for amd64 Linux."""
    config: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in env.items()]}
    if user:
        config["User"] = user
    if workdir and workdir != "/":
        config["WorkingDir"] = workdir
    if entrypoint is not None:
        config["Entrypoint"] = entrypoint
    if cmd is not None:
        config["Cmd"] = cmd
    return {"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z", "config": config}


def base_spec(cfg: DockerfileConfig) -> LayerSpec:
    """The base layer (Debian packages, busybox links, the Dockerfile's account), keyed by the
    packages' versions and sha256."""
    debs = resolve_debs(BASE_PACKAGES)
    key = sha(json.dumps([builder_source(), "base", [d.__dict__ for d in debs], cfg.account], sort_keys=True))
    return LayerSpec("base", key, base_layer(cfg.account))


def trainer_config(cfg: DockerfileConfig | None = None) -> dict[str, Any]:
    """The trainer image's OCI config (without rootfs), from docker/Dockerfile's final stage."""
    cfg = cfg or dockerfile_config()
    return image_config(cfg.user, cfg.env, cfg.workdir, cfg.entrypoint, cfg.cmd)


def trainer_image() -> Image:
    """The trainer test image (built on first use, then cached by the hash of its inputs)."""
    cfg = dockerfile_config()
    stdlib = resolve_debs(STDLIB_PACKAGES)
    python_version = next(d.version for d in resolve_debs(BASE_PACKAGES) if d.package == "python3.11-minimal")
    python_version = python_version.split("-")[0]
    dists, venv_key = venv_inputs(cfg.pins)
    code = code_entries(context_files(cfg.copies), cfg.workdir)
    code_hash = hashlib.sha256()
    for e in code:
        code_hash.update(f"{e.path} {e.kind} {e.mode:o}\n".encode())
        code_hash.update(hashlib.sha256(e.data or b"").digest())
    src = builder_source()
    specs = [
        base_spec(cfg),
        LayerSpec("stdlib", sha(json.dumps([src, "stdlib", [d.__dict__ for d in stdlib]])), stdlib_layer),
        LayerSpec(
            "venv",
            sha(json.dumps([src, "venv", cfg.venv_from, python_version, venv_key])),
            venv_layer(dists, cfg.venv_from, python_version),
        ),
        LayerSpec("code", sha(json.dumps([src, "code", cfg.workdir, code_hash.hexdigest()])), lambda: code),
    ]
    return cached_image("trainer", specs, trainer_config(cfg))


def utility_image() -> Image:
    """Small image for init containers: busybox applets, /bin/sh = dash, /bin/nslookup = Python gethostbyname."""
    cfg = dockerfile_config()
    return cached_image("utility", [base_spec(cfg)], image_config("", dict(BASE_ENV), "/", None, ["sh"]))


def pause_image() -> Image:
    """The sandbox image: the pause binary of tools/cluster/pause as /pause, Entrypoint ["/pause"]."""
    try:
        binary = build.binary("pause")
    except build.BuildError as e:
        raise ImageError(f"the pause image needs the pause binary: {e}") from e
    data = binary.read_bytes()
    key = sha(json.dumps([builder_source(), "pause", sha(data)]))
    spec = LayerSpec("pause", key, lambda: [Entry("pause", "file", 0o755, data=data)])
    return cached_image("pause", [spec], image_config("", {}, "/", ["/pause"], None))


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--print"]:
            img = trainer_image()
            info = read_archive(img.archive)
            layers = [{"digest": la["digest"], "size": la["size"]} for la in info["manifest"]["layers"]]
            out = {"name": img.name, "digest": img.digest, "archive": str(img.archive), "layers": layers}
            print(json.dumps({**out, "config": info["config"]["config"]}, indent=1))
        elif argv[:1] == ["--unpack"] and len(argv) == 2:
            unpack(trainer_image().archive, Path(argv[1]))
        elif not argv:
            for make in (trainer_image, utility_image, pause_image):
                img = make()
                print(img.name, img.digest, img.archive)
        else:
            print(USAGE, file=sys.stderr)
            return 2
    except ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
