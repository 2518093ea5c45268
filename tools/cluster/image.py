"""Container images for the real-pods level, built from the repository without a daemon or a registry.

    python -m tools.cluster.image            # build (or find) all three, print "<name> <digest> <archive>"
    python -m tools.cluster.image --print    # print the trainer image's config and layers, build nothing new

    from tools.cluster import image
    img = image.trainer_image()      # Image(archive, name="localhost/fsdp-gitops/trainer:test-<hash>", digest)
    image.pause_image()              # the pause program alone, Entrypoint ["/pause"] (the sandbox image)
    image.utility_image()            # busybox + dash + a Python nslookup, for init containers

Each function returns an `Image`: `archive` is an OCI image layout packed as one uncompressed tar,
importable with `ctr -n k8s.io images import <archive>`; its index.json names the image
(`io.containerd.image.name` = `name`), so the import registers it under `name`, which pods use with
`imagePullPolicy: IfNotPresent` (the tag is never `latest`). `digest` is the manifest's digest
(what the kubelet reports as the container's imageID). `repository` and `tag` split `name` for
kustomize's `images:` (newName / newTag).

Images are cached in `build.cache_root()/images/<kind>-<key>/`, where <key> hashes every input (the
Debian packages by name, version and sha256, the Python distributions by name, version and RECORD,
the trainer package's files, the configuration derived from docker/Dockerfile, and this file), so a
warm call only hashes. A build writes under a temporary name and renames, under a lock, so
concurrent sessions never see half an archive.

The trainer image: a Debian 12 root file system (python3.11 from the Debian packages, unpacked with
`dpkg -x`), /opt/venv with the trainer's pinned Python dependencies copied from the installed test
environment (the same files the test suite runs), and trainer/ at /opt/fsdp/trainer, with the user,
group, working directory, entry point and environment of docker/Dockerfile's final stage (parsed
from it, see `dockerfile_config`). Three layers: the OS, the Python packages, the trainer code, so a
trainer change rebuilds only the small last layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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


class ImageError(RuntimeError):
    """An image could not be built (a missing Debian package, a pin the environment does not hold, ...)."""


def trainer_image() -> Image:
    """The trainer test image (built on first use, then cached by the hash of its inputs)."""
    raise NotImplementedError


def pause_image() -> Image:
    """The sandbox image: the pause binary of tools/cluster/pause as /pause, Entrypoint ["/pause"]."""
    raise NotImplementedError


def utility_image() -> Image:
    """Small image for init containers: busybox applets, /bin/sh = dash, /bin/nslookup = Python gethostbyname."""
    raise NotImplementedError
