"""Container images for the real-pods level, built from the repository without a daemon or a registry.

    python -m tools.cluster.image            # build (or find) all three, print "<name> <digest> <archive>"
    python -m tools.cluster.image --print    # the trainer image: name, digest, config, layers (JSON)
    python -m tools.cluster.image --unpack DIR   # the trainer image's file system into DIR (for chroot)

    from tools.cluster import image
    img = image.trainer_image()      # Image(archive, name="localhost/fsdp-gitops/trainer:test-<hash>", digest)
    image.pause_image()              # the pause program alone, Entrypoint ["/pause"] (the sandbox image)
    image.utility_image()            # busybox + dash + a Python nslookup, for init containers
    image.controller_images()        # the Training Operator, Kueue and etcd under their upstream references
    image.delta_archive(img, present_digests)   # the archive without blobs containerd already holds

Each function returns an `Image`: `archive` is an OCI image layout packed as one tar with uncompressed
layers, importable with `ctr -n k8s.io images import <archive>`; its index.json names the image
(`io.containerd.image.name` = `name`), so the import registers it under `name`, which pods use with
`imagePullPolicy: IfNotPresent` (the tag is never `latest`). `digest` is the manifest's digest (what
the kubelet reports as the container's imageID). `repository` and `tag` split `name` for kustomize's
`images:` (newName / newTag).

Caching. Every layer is kept in `build.cache_root()/images/layers/` and every archive in
`build.cache_root()/images/<kind>-<key>/`, each keyed by the sha256 of all its inputs: the Debian
packages by name, version and sha256 (as apt-cache reports them), the Python distributions by name,
version and RECORD (which hashes every file), the trainer package's files, the configuration derived
from docker/Dockerfile and the builder's own source (every module of this package). A warm call only
hashes; a build writes under a temporary name and renames, under a lock, so concurrent sessions never
see half an archive.

The trainer image mirrors the final stage of docker/Dockerfile (`dockerfile_config` reads it): the
same user and group (uid/gid 10001 `trainer`, home /home/trainer), working directory, environment,
entry point, the files the stage COPYs from the build context (trainer/ at /opt/fsdp/trainer), and
/opt/venv holding the Python packages the Dockerfile's pip line names, with their dependencies. What
differs, and why, is in `KNOWN_DIFFERENCES`: the test image runs on CPU nodes with gloo, so it has no
CUDA base image, no EFA stack and no bash, and its Python comes from Debian 12 packages. Four
layers, the shared ones first: base (busybox, dash, python3.11-minimal, users; the utility image is
this layer alone), the rest of the Python standard library, /opt/venv, and the trainer code, so a
change to trainer/ rebuilds only the last, small layer.

/opt/venv is packed from the Python environment this package runs in (the test environment that
`tools/setup.sh test` installs from requirements/test.txt), so the image runs exactly the files the
test suite ran; the build checks that the Dockerfile's pins are the installed versions. Files only a
GPU loads (cuDNN's engine libraries, CUDA compilers, headers, static archives) are left out
(`GPU_ONLY_FILES`); `import torch` and a CPU training run need none of them.

The parts, each standing only on the ones before it (and on tools.cluster.build and schemas):

    common       Image, ImageError, the constants every layer shares, the cache folder's helpers
    dockerfile   docker/Dockerfile's final stage read: DockerfileConfig, dockerfile_config
    layers       Entry and write_layer: deterministic layer tars, hashed as they are written
    debs         Debian packages (resolve, fetch, unpack) and the base and stdlib layers made of them
    python       /opt/venv from the installed distributions, and the code layer
    archive      the OCI layout in one tar: write_archive, read_archive, unpack, delta_archive
    cache        keys, the lock, the layer records, pruning and the cached build
    images       the trainer, utility and pause images, and the command line (main)
    controllers  the controllers' images under their upstream references, and Kueue's chart
"""

from __future__ import annotations

from tools.cluster.image.archive import Layer, delta_archive, read_archive, unpack, write_archive
from tools.cluster.image.cache import LayerSpec
from tools.cluster.image.common import EPOCH, REGISTRY, Image, ImageError, canonical
from tools.cluster.image.controllers import controller_images
from tools.cluster.image.debs import BASE_PACKAGES, STDLIB_PACKAGES, base_layer, resolve_debs, stdlib_layer
from tools.cluster.image.dockerfile import (
    ACKNOWLEDGED_RUNS,
    BASE_ENV,
    KNOWN_DIFFERENCES,
    DockerfileConfig,
    dockerfile_config,
)
from tools.cluster.image.images import image_config, main, pause_image, trainer_config, trainer_image, utility_image
from tools.cluster.image.layers import Entry, pyc_header_fix, write_layer
from tools.cluster.image.python import code_layer, context_files, venv_inputs, venv_layer

__all__ = [
    "ACKNOWLEDGED_RUNS",
    "BASE_ENV",
    "BASE_PACKAGES",
    "EPOCH",
    "KNOWN_DIFFERENCES",
    "REGISTRY",
    "STDLIB_PACKAGES",
    "DockerfileConfig",
    "Entry",
    "Image",
    "ImageError",
    "Layer",
    "LayerSpec",
    "base_layer",
    "canonical",
    "code_layer",
    "context_files",
    "controller_images",
    "delta_archive",
    "dockerfile_config",
    "image_config",
    "main",
    "pause_image",
    "pyc_header_fix",
    "read_archive",
    "resolve_debs",
    "stdlib_layer",
    "trainer_config",
    "trainer_image",
    "unpack",
    "utility_image",
    "venv_inputs",
    "venv_layer",
    "write_archive",
    "write_layer",
]
