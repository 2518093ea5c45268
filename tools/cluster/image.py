"""Container images for the real-pods level, built from the repository without a daemon or a registry.

    python -m tools.cluster.image            # build (or find) all three, print "<name> <digest> <archive>"
    python -m tools.cluster.image --print    # the trainer image: name, digest, config, layers (JSON)
    python -m tools.cluster.image --unpack DIR   # the trainer image's file system into DIR (for chroot)

    from tools.cluster import image
    img = image.trainer_image()      # Image(archive, name="localhost/fsdp-gitops/trainer:test-<hash>", digest)
    image.pause_image()              # the pause program alone, Entrypoint ["/pause"] (the sandbox image)
    image.utility_image()            # busybox + dash + a Python nslookup, for init containers
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
from docker/Dockerfile and this file's own source. A warm call only hashes; a build writes under a
temporary name and renames, under a lock, so concurrent sessions never see half an archive.

The trainer image mirrors the final stage of docker/Dockerfile (`dockerfile_config` reads it): the
same user and group (uid/gid 10001 `trainer`, home /home/trainer), working directory, environment,
entry point, the files the stage COPYs from the build context (trainer/ at /opt/fsdp/trainer), and
/opt/venv holding the Python packages the Dockerfile's pip line names, with their dependencies. What
differs, and why, is in `KNOWN_DIFFERENCES`: the test image runs on CPU nodes with gloo, so it has no
CUDA base image, no EFA stack and no bash, and its Python comes from Debian 12 packages. Four
layers, the shared ones first: base (busybox, dash, python3.11-minimal, users; the utility image is
this layer alone), the rest of the Python standard library, /opt/venv, and the trainer code, so a
change to trainer/ rebuilds only the last, small layer.

/opt/venv is packed from the Python environment this module runs in (the test environment that
`tools/setup.sh test` installs from requirements/test.txt), so the image runs exactly the files the
test suite ran; the build checks that the Dockerfile's pins are the installed versions. Files only a
GPU loads (cuDNN's engine libraries, CUDA compilers, headers, static archives) are left out
(`GPU_ONLY_FILES`); `import torch` and a CPU training run need none of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import importlib
import importlib.metadata as metadata
import io
import json
import mmap
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tools.cluster import build

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
REGISTRY = "localhost/fsdp-gitops"  # image names: <REGISTRY>/<kind>:test-<key>; nothing is ever pulled
EPOCH = 0  # the mtime of every file in every layer (deterministic layers; the .pyc headers are set to match)
PYTHON = "3.11"  # Debian 12's python3.11; the environment packed into /opt/venv must be the same minor version

# Debian 12 packages, by layer. Versions are not pinned here (the archive drops superseded versions);
# the versions and sha256 apt-cache reports are part of every cache key, and a different candidate
# builds anew. Left out on purpose: libnsl2/libtirpc3 (only the stdlib's `nis` module needs them) and
# ca-certificates (nothing in a test pod reaches TLS endpoints; certifi ships its own bundle).
BASE_PACKAGES = (
    "libc6",
    "zlib1g",
    "libssl3",
    "libexpat1",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "busybox-static",
    "dash",
    "netbase",
)
STDLIB_PACKAGES = (
    "libpython3.11-stdlib",
    "libgcc-s1",
    "libstdc++6",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libsqlite3-0",
    "libuuid1",
    "libcrypt1",
    "libncursesw6",
    "libtinfo6",
    "libreadline8",
    "readline-common",
    "libdb5.3",
    "media-types",
    "tzdata",
)
DEB_SKIP = ("usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*", "usr/share/doc/*")

# Files of the packed distributions that only a GPU process loads, relative to site-packages. torch's
# libraries link the CUDA libraries they name (cuBLAS, cuFFT, NCCL, ...), so those stay; cuDNN's
# engine libraries are dlopened by libcudnn.so.9 when a GPU convolution first runs, ptxas compiles for
# a GPU, headers serve torch.compile's C++ builds (the trainer compiles on GPU only).
GPU_ONLY_FILES = (
    "nvidia/cudnn/lib/libcudnn_*.so.9",
    "nvidia/cu13/lib/libnvperf_*",
    "nvidia/cu13/lib/libcusolverMg.so.*",
    "nvidia/*/include/*",
    "nvidia/nvshmem/lib/*.bc",
    "torch/include/*",
    "torch/bin/ptxas",
    "triton/backends/*/include/*",
    "triton/backends/nvidia/bin/*",
    "*.a",
)

# The base image's default environment (Docker's PATH); the CUDA base image adds CUDA and NVIDIA
# settings on top, which a CPU image must not carry.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# Directories of the Dockerfile's PATH-like variables that only the CUDA/EFA image has.
EFA_ONLY_DIRS = ("/opt/amazon/efa/bin", "/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib")

KNOWN_DIFFERENCES = (
    "base: Debian 12 packages (python3.11 3.11.2, busybox, dash) instead of nvidia/cuda:13.0.2-base-ubuntu24.04 "
    "(Ubuntu's python3 3.12): no CUDA user space, no NVIDIA_*/CUDA_* variables, no bash (/bin/sh is dash)",
    "EFA: no libfabric, rdma-core or aws-ofi-nccl (the EFA installer RUN); "
    "/opt/amazon/efa/bin leaves PATH and LD_LIBRARY_PATH is unset (it would name only EFA folders)",
    "the base image's ENTRYPOINT/CMD (the CUDA entrypoint script, bash) are not set: pods give their command",
    "user: trainer's login shell is /bin/sh (no bash); uid, gid, name, group and home are the Dockerfile's",
    "/opt/venv: the packages and versions of the Dockerfile's pip line, packed from the test environment "
    "(CPU use: GPU-only files left out, GPU_ONLY_FILES), under Debian's python3.11 instead of Ubuntu's python3",
    "no /opt/amazon/ofi-nccl/lib/libcudart.so link and no build-time verify_image.py run (both need EFA and CUDA)",
    "/bin/nslookup is a Python gethostbyname wrapper (busybox 1.35's nslookup fails on any NXDOMAIN search variant)",
)

# RUN instructions of the Dockerfile's final stage the test image does not replicate, by the sha256 of
# the instruction (continuation lines joined); each is CUDA/EFA-only or mirrored by hand (useradd).
# A RUN that is new or changed fails the build until it is mirrored here and its hash added.
ACKNOWLEDGED_RUNS = {
    "3f580b08dc41": "apt-get install ca-certificates curl libhwloc15 python3, the EFA installer, useradd trainer "
    "(mirrored: users from the useradd options)",
    "77c140b09d3e": "libcudart.so link for aws-ofi-nccl (EFA only)",
    "e2b03e35980b": "verify_image.py: NCCL and EFA checks (GPU image only)",
}
# Final-stage instructions that change nothing a container sees at run time, or are read below.
RUNTIME_NEUTRAL = {"ARG", "LABEL", "SHELL"}


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


# ---------------------------------------------------------------------------------------------------
# docker/Dockerfile: the final stage's run-time facts


@dataclass
class DockerfileConfig:
    user: str = ""
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)  # after $VAR substitution, in order
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    copies: list[tuple[str, str]] = field(default_factory=list)  # (context source, destination)
    venv_from: str = ""  # the COPY --from=<stage> <venv> <venv> destination
    account: dict[str, Any] = field(default_factory=dict)  # name, uid, gid, home, create_home
    pins: dict[str, str] = field(default_factory=dict)  # the python-env stage's pip pins
    runs: list[str] = field(default_factory=list)  # sha256[:12] of each final-stage RUN


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[int, str, str]] = []
    current, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        line = current + stripped
        current = ""
        word, _, rest = line.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def _substitute(value: str, env: dict[str, str]) -> str:
    return re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: env.get(m[1] or m[2], ""), value
    )


def _env_pairs(args: str) -> list[tuple[str, str]]:
    words = shlex.split(args, posix=True)
    if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        return [(words[0], args.split(None, 1)[1] if len(words) > 1 else "")]
    return [tuple(w.split("=", 1)) for w in words]  # type: ignore[misc]


def _exec_form(args: str) -> list[str]:
    if args.startswith("["):
        return list(json.loads(args))
    return ["/bin/sh", "-c", args]


def dockerfile_config(path: Path = DOCKERFILE) -> DockerfileConfig:
    """The run-time facts of the Dockerfile's final stage, as the test image reproduces them.

    Raises ImageError naming the line for an instruction the test image cannot follow (a new RUN, a
    VOLUME, ...), so that a Dockerfile change can never silently leave the test image behind."""
    text = path.read_text()
    instructions = _instructions(text)
    froms = [i for i, (_, word, _) in enumerate(instructions) if word == "FROM"]
    if not froms:
        raise ImageError(f"{path}: no FROM instruction")
    cfg = DockerfileConfig()
    args: dict[str, str] = {}
    for _, word, rest in instructions[: froms[-1]]:
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
        if word == "RUN" and "pip install" in rest:
            for name, version in re.findall(r"""["']?([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s"']+)["']?""", rest):
                cfg.pins[_canonical(name)] = _substitute(version, args)
    env = dict(BASE_ENV)
    for number, word, rest in instructions[froms[-1] + 1 :]:
        where = f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}:{number}"
        if word == "ARG":
            name, _, value = rest.partition("=")
            args[name] = value
        elif word == "ENV":
            for key, value in _env_pairs(rest):
                env[key] = _substitute(value, {**args, **env})
        elif word == "USER":
            cfg.user = _substitute(rest, {**args, **env})
        elif word == "WORKDIR":
            cfg.workdir = os.path.normpath(os.path.join(cfg.workdir, _substitute(rest, {**args, **env})))
        elif word == "ENTRYPOINT":
            cfg.entrypoint = _exec_form(rest)
            cfg.cmd = None  # Docker resets CMD when ENTRYPOINT is set
        elif word == "CMD":
            cfg.cmd = _exec_form(rest)
        elif word == "COPY":
            words = shlex.split(rest)
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--from=") for f in flags):
                if len(paths) != 2 or paths[0] != paths[1]:
                    raise ImageError(f"{where}: COPY --from is expected to copy one folder to the same path")
                cfg.venv_from = paths[1]
            elif len(paths) != 2 or flags:
                raise ImageError(f"{where}: COPY with {len(paths)} paths or flags {flags} is not mirrored")
            else:
                cfg.copies.append((paths[0], paths[1]))
        elif word == "RUN":
            digest = hashlib.sha256(rest.encode()).hexdigest()[:12]
            cfg.runs.append(digest)
            match = re.search(r"useradd\s+([^&;|]*)", rest)
            if match:
                cfg.account = _useradd(match[1], where)
            if digest not in ACKNOWLEDGED_RUNS:
                raise ImageError(
                    f"{where}: RUN {rest[:60]}... is new or changed; mirror what it does for run time in "
                    f"tools/cluster/image.py and add {digest!r} to ACKNOWLEDGED_RUNS"
                )
        elif word not in RUNTIME_NEUTRAL:
            raise ImageError(f"{where}: {word} is not mirrored by the test image (tools/cluster/image.py)")
    cfg.env = {
        k: v for k, v in ((k, _drop_efa_dirs(k, v)) for k, v in env.items()) if v or k not in {"LD_LIBRARY_PATH"}
    }
    if not cfg.account:
        raise ImageError(f"{path}: the final stage creates no user (useradd)")
    if not cfg.venv_from:
        raise ImageError(f"{path}: the final stage copies no Python environment (COPY --from=python-env)")
    return cfg


def _drop_efa_dirs(key: str, value: str) -> str:
    if key not in {"PATH", "LD_LIBRARY_PATH"}:
        return value
    return ":".join(d for d in value.split(":") if d and d not in EFA_ONLY_DIRS)


def _useradd(options: str, where: str) -> dict[str, Any]:
    words = shlex.split(options)
    account: dict[str, Any] = {"create_home": False, "user_group": False, "shell": "/bin/sh"}
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--uid", "-u"):
            account["uid"] = int(words[i + 1])
            i += 1
        elif w in ("--gid", "-g"):
            account["gid"] = int(words[i + 1])
            i += 1
        elif w in ("--home-dir", "-d"):
            account["home"] = words[i + 1]
            i += 1
        elif w in ("--shell", "-s"):
            account["dockerfile_shell"] = words[i + 1]
            i += 1
        elif w in ("--create-home", "-m"):
            account["create_home"] = True
        elif w in ("--user-group", "-U"):
            account["user_group"] = True
        elif w.startswith("-"):
            raise ImageError(f"{where}: useradd option {w} is not mirrored by the test image")
        else:
            account["name"] = w
        i += 1
    if "uid" not in account or "name" not in account:
        raise ImageError(f"{where}: useradd without --uid or a name")
    account.setdefault("gid", account["uid"])
    account.setdefault("home", f"/home/{account['name']}")
    return account


# ---------------------------------------------------------------------------------------------------
# Layers: entries, written as deterministic tars with the digest computed on the fly


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


def _pyc_header_fix(pyc: bytes, source: Path) -> bytes:
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
                data = _pyc_header_fix(e.source.read_bytes(), pyc_source)
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


# ---------------------------------------------------------------------------------------------------
# Debian packages


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.package}={self.version}"


def _apt_state() -> str:
    """Changes whenever apt's package lists or configuration change (cheap: stat only)."""
    h = hashlib.sha256()
    for folder in ("/var/lib/apt/lists", "/etc/apt", "/etc/apt/sources.list.d", "/etc/apt/preferences.d"):
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(folder)):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(folder, name))
                    h.update(f"{folder}/{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def resolve_debs(packages: Iterable[str]) -> list[Deb]:
    """The candidate version and sha256 of each package, from apt-cache (memoised per apt state)."""
    names = sorted(set(packages))
    memo = _images_dir() / "apt" / f"{_apt_state()}-{_sha(' '.join(names))[:16]}.json"
    if memo.is_file():
        return [Deb(**d) for d in json.loads(memo.read_text())]
    if shutil.which("apt-cache") is None:
        raise ImageError("apt-cache not found: the test images are built from Debian packages (a Debian machine)")
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *names], capture_output=True, text=True, env=_apt_env()
    )
    found: dict[str, Deb] = {}
    for stanza in proc.stdout.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, re.M))
        if fields.get("Package") in names and "SHA256" in fields:
            found.setdefault(fields["Package"], Deb(fields["Package"], fields["Version"], fields["SHA256"]))
    missing = [n for n in names if n not in found]
    if missing:
        raise ImageError(f"apt-cache knows no {', '.join(missing)}: run `apt-get update` (Debian 12 packages)")
    debs = [found[n] for n in names]
    _atomic_write(memo, json.dumps([d.__dict__ for d in debs]).encode())
    return debs


def _apt_env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C"}


def fetch_debs(debs: list[Deb]) -> dict[str, Path]:
    """The .deb file of each package, downloaded once with `apt-get download` and checked by sha256."""
    folder = build.cache_root() / "debs"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {d.package: folder / f"{d.package}_{d.sha256[:16]}.deb" for d in debs}
    todo = [d for d in debs if not paths[d.package].is_file()]
    if todo:
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            proc = build.run_with_progress(
                ["apt-get", "download", *(d.pin for d in todo)],
                f"image: apt-get download of {len(todo)} packages",
                doing="downloading",
                cwd=tmp,
                capture_output=True,
                text=True,
                env=_apt_env(),
            )
            if proc.returncode != 0:
                raise ImageError(f"apt-get download failed: {proc.stderr.strip().splitlines()[-1:]}")
            files = {p.name.split("_", 1)[0]: p for p in Path(tmp).glob("*.deb")}
            for d in todo:
                got = files.get(d.package)
                if got is None or _file_sha256(got) != d.sha256:
                    raise ImageError(f"apt-get download {d.pin}: no file or a sha256 other than apt-cache's")
                os.replace(got, paths[d.package])
    return paths


def deb_entries(deb: Path) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """The members of a package's data archive (`dpkg-deb --fsys-tarfile`), documentation left out."""
    proc = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True)
    if proc.returncode != 0:
        raise ImageError(f"dpkg-deb --fsys-tarfile {deb}: {proc.stderr.decode().strip()}")
    contents: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
        for m in tar:
            name = m.name.removeprefix("./").strip("/")
            if not name or any(fnmatch.fnmatch(name, p) for p in DEB_SKIP):
                continue
            data = b""
            if m.isreg():
                f = tar.extractfile(m)
                data = f.read() if f else b""
                contents[name] = data
            elif m.islnk():  # hard link: a copy of the file it names
                data = contents[m.linkname.removeprefix("./").strip("/")]
                m.type, m.size = tarfile.REGTYPE, len(data)
            m.name = name
            yield m, data


def debs_layer(debs: list[Deb]) -> list[Entry]:
    paths = fetch_debs(debs)
    entries: list[Entry] = []
    for d in debs:
        for m, data in deb_entries(paths[d.package]):
            if m.isdir():
                entries.append(Entry(m.name, "dir", m.mode & 0o7777))
            elif m.issym():
                entries.append(Entry(m.name, "symlink", 0o777, target=m.linkname))
            elif m.isreg():
                entries.append(Entry(m.name, "file", m.mode & 0o7777, data=data))
    return entries


# ---------------------------------------------------------------------------------------------------
# The layers of the three images


NSLOOKUP = '''#!/usr/bin/python3.11
"""nslookup NAME: resolve NAME with the C library's resolver (the pod's resolv.conf search list),
print its address and exit 0, or exit 1. Stands in for busybox's nslookup, which fails whenever one
search-list variant of the name is NXDOMAIN although the name itself resolves."""
import socket
import sys

if len(sys.argv) != 2:
    sys.exit("usage: nslookup NAME")
try:
    address = socket.gethostbyname(sys.argv[1])
except OSError as e:
    print(f"nslookup: can't resolve '{sys.argv[1]}': {e}", file=sys.stderr)
    sys.exit(1)
print(f"Name:\\t{sys.argv[1]}\\nAddress: {address}")
'''


def _accounts(account: dict[str, Any]) -> list[Entry]:
    name, uid, gid, home = account["name"], account["uid"], account["gid"], account["home"]
    passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    passwd += f"{name}:x:{uid}:{gid}::{home}:{account['shell']}\n"
    group = f"root:x:0:\nnogroup:x:65534:\n{name}:x:{gid}:\n"
    entries = [
        Entry("etc/passwd", "file", 0o644, data=passwd.encode()),
        Entry("etc/group", "file", 0o644, data=group.encode()),
        Entry("etc/nsswitch.conf", "file", 0o644, data=b"passwd: files\ngroup: files\nhosts: files dns\n"),
        Entry("root", "dir", 0o700),
    ]
    if account["create_home"]:
        entries.append(Entry(home.strip("/"), "dir", 0o750, uid=uid, gid=gid))
    return entries


def _busybox_links(busybox: bytes, taken: set[str]) -> list[Entry]:
    """A link per busybox applet (as `busybox --install -s`), except where a package put a file, sh
    (dash) and nslookup (the Python one)."""
    with tempfile.NamedTemporaryFile(prefix="busybox-", delete=False) as f:
        f.write(busybox)
    try:
        os.chmod(f.name, 0o755)
        listing = subprocess.run([f.name, "--list-full"], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    entries = []
    for path in listing.split():
        name = path.rsplit("/", 1)[-1]
        if path in taken or name in {"sh", "nslookup", "busybox", "linuxrc"}:
            continue
        entries.append(Entry(path, "symlink", 0o777, target="/bin/busybox"))
    return entries


def _base_layer(account: dict[str, Any]) -> Callable[[], list[Entry]]:
    def make() -> list[Entry]:
        entries = debs_layer(resolve_debs(BASE_PACKAGES))
        taken = {e.path for e in entries}
        busybox = next(e.data for e in entries if e.path == "bin/busybox" and e.data)
        entries += _busybox_links(busybox, taken)
        entries += [
            Entry("bin/sh", "symlink", 0o777, target="dash"),
            Entry("bin/nslookup", "file", 0o755, data=NSLOOKUP.encode()),
            Entry("usr/bin/python3", "symlink", 0o777, target="python3.11"),
            Entry("tmp", "dir", 0o1777),
            *(Entry(d, "dir") for d in ("proc", "sys", "dev", "run", "etc", "var/tmp", "home", "usr/local/bin")),
            Entry("etc/hosts", "file", 0o644, data=b"127.0.0.1 localhost\n"),
            *_accounts(account),
        ]
        return entries

    return make


def _stdlib_layer() -> list[Entry]:
    return debs_layer(resolve_debs(STDLIB_PACKAGES))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def venv_distributions(pins: dict[str, str]) -> list[metadata.Distribution]:
    """The installed distributions the pinned packages need (their requirements, extras followed),
    checked against the pins; sorted by name."""
    # packaging (a dependency of pip's own tooling, in every environment that installed the pins)
    requirement = importlib.import_module("packaging.requirements").Requirement

    if sys.version_info[:2] != tuple(int(x) for x in PYTHON.split(".")):
        raise ImageError(f"the image's /opt/venv is packed from this environment, which must be Python {PYTHON}")
    installed = {_canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    for name, version in pins.items():
        got = installed.get(name)
        if got is None or got.version != version:
            raise ImageError(
                f"docker/Dockerfile pins {name}=={version} but this environment has "
                f"{got.version if got else 'none'}: run `bash tools/setup.sh test` (requirements/test.txt)"
            )
    chosen: dict[str, metadata.Distribution] = {}
    stack: list[tuple[str, str]] = [(name, "") for name in pins]
    seen: set[tuple[str, str]] = set()
    while stack:
        name, extra = stack.pop()
        name = _canonical(name)
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        dist = installed.get(name)
        if dist is None:
            raise ImageError(f"{name} is required by the trainer's packages but not installed here")
        chosen[name] = dist
        for line in dist.requires or []:
            req = requirement(line)
            marker = str(req.marker or "")
            if extra and "extra" not in marker:
                continue  # the base requirements were followed without the extra
            if req.marker and not req.marker.evaluate({"extra": extra}):
                continue
            stack.append((req.name, ""))
            stack.extend((req.name, e) for e in sorted(req.extras))
    return [chosen[n] for n in sorted(chosen)]


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _venv_inputs(pins: dict[str, str]) -> tuple[list[metadata.Distribution], str]:
    dists = venv_distributions(pins)
    h = hashlib.sha256()
    for d in dists:
        h.update(f"{_canonical(d.metadata['Name'])}=={d.version}\n".encode())
        record = d.read_text("RECORD") or ""
        h.update(hashlib.sha256(record.encode()).digest())
    return dists, h.hexdigest()


def _console_script(module: str, func: str) -> bytes:
    return (
        "#!/opt/venv/bin/python\nimport re\nimport sys\n"
        f"from {module} import {func.split('.')[0]}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({func}())\n"
    ).encode()


def _venv_layer(dists: list[metadata.Distribution], venv: str, python_version: str) -> Callable[[], list[Entry]]:
    def make() -> list[Entry]:
        site = _site_packages().resolve()
        prefix = f"{venv.strip('/')}/lib/python{PYTHON}/site-packages"
        entries = [
            Entry(f"{venv}/pyvenv.cfg".strip("/"), "file", 0o644, data=_pyvenv_cfg(python_version)),
            Entry(f"{venv}/bin/python3".strip("/"), "symlink", 0o777, target=f"/usr/bin/python{PYTHON}"),
            Entry(f"{venv}/bin/python".strip("/"), "symlink", 0o777, target="python3"),
            Entry(f"{venv}/bin/python{PYTHON}".strip("/"), "symlink", 0o777, target="python3"),
            Entry(f"{venv}/lib64".strip("/"), "symlink", 0o777, target="lib"),
        ]
        freeze = []
        for d in dists:
            freeze.append(f"{d.metadata['Name']}=={d.version}")
            for f in d.files or []:
                path = Path(str(d.locate_file(f))).resolve() if ".." in f.parts else Path(str(d.locate_file(f)))
                try:
                    rel = path.relative_to(site).as_posix()
                except ValueError:
                    continue  # a script under bin/: written below for /opt/venv
                if any(fnmatch.fnmatch(rel, p) for p in GPU_ONLY_FILES):
                    continue
                if path.is_symlink():
                    entries.append(Entry(f"{prefix}/{rel}", "symlink", 0o777, target=os.readlink(path)))
                elif path.is_file():
                    mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
                    entries.append(Entry(f"{prefix}/{rel}", "file", mode, source=path))
            for ep in d.entry_points:
                if ep.group == "console_scripts":
                    script = _console_script(ep.module, ep.attr)
                    entries.append(Entry(f"{venv.strip('/')}/bin/{ep.name}", "file", 0o755, data=script))
        freeze.sort(key=str.lower)
        entries.append(
            Entry(f"{venv.strip('/')}/pip-freeze.txt", "file", 0o644, data="\n".join(freeze).encode() + b"\n")
        )
        return entries

    return make


def _pyvenv_cfg(python_version: str) -> bytes:
    return (
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python_version}\n"
        f"executable = /usr/bin/python{PYTHON}\n"
    ).encode()


def _context_files(copies: list[tuple[str, str]]) -> list[tuple[str, Path]]:
    """(image path, file) for the Dockerfile's COPYs from the build context, .dockerignore's
    __pycache__/*.pyc exclusions applied."""
    out: list[tuple[str, Path]] = []
    for src, dest in copies:
        source = REPO_ROOT / src
        if source.is_file():
            target = dest + source.name if dest.endswith("/") else dest
            out.append((target.strip("/"), source))
            continue
        if not source.is_dir():
            raise ImageError(f"docker/Dockerfile copies {src}, which does not exist")
        for root, dirs, files in os.walk(source):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".pyc"):
                    continue
                path = Path(root) / name
                out.append((f"{dest.strip('/')}/{path.relative_to(source).as_posix()}", path))
    return out


def _code_entries(files: list[tuple[str, Path]], workdir: str) -> list[Entry]:
    """The code layer's entries, read once: the cache key hashes exactly the bytes that are packed,
    even while someone edits trainer/."""
    entries = [Entry(workdir.strip("/"), "dir")]
    for target, path in files:
        mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
        entries.append(Entry(target, "file", mode, data=path.read_bytes()))
    return entries


def _code_layer(files: list[tuple[str, Path]], workdir: str) -> Callable[[], list[Entry]]:
    entries = _code_entries(files, workdir)
    return lambda: entries


# ---------------------------------------------------------------------------------------------------
# Cache, archive


def _images_dir() -> Path:
    return build.cache_root() / "images"


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _builder_source() -> str:
    return _sha(Path(__file__).read_bytes())


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    _images_dir().mkdir(parents=True, exist_ok=True)
    with open(_images_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same image
        yield


@dataclass(frozen=True)
class LayerSpec:
    name: str  # base, stdlib, venv, code, pause
    key: str  # sha256 of every input
    make: Callable[[], list[Entry]]


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
            "digest": "sha256:" + _sha(config_blob),
            "size": len(config_blob),
        },
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.digest, "size": layer.size}
            for layer in placed
        ],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + _sha(manifest_blob)
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
        f"blobs/sha256/{_sha(config_blob)}": config_blob,
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


def _image_config(
    user: str, env: dict[str, str], workdir: str, entrypoint: list[str] | None, cmd: list[str] | None
) -> dict[str, Any]:
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


KEEP = 2  # archives kept per image kind (the newest); older ones, and the layer records pointing into them, go


def _prune(kind: str) -> None:
    """Remove all but the KEEP newest archives of `kind` and the layer records that point into removed
    archives (under the lock: no build is running). A trainer archive is gigabytes, and every change to
    trainer/ makes one."""
    images = _images_dir()
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


def _cached_layer(spec: LayerSpec) -> Layer | None:
    """Where the layer of `spec` was written before (inside an archive), if that archive is still there."""
    record = _images_dir() / "layers" / f"{spec.name}-{spec.key[:24]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads(record.read_text())
        layer = Layer(Path(info["path"]), info["digest"], info["size"], info["offset"])
        if layer.path.is_file() and layer.path.stat().st_size >= layer.offset + layer.size:
            return layer
    return None


def _image(kind: str, specs: list[LayerSpec], config: dict[str, Any]) -> Image:
    key = _sha(json.dumps([_builder_source(), kind, [(s.name, s.key) for s in specs], config], sort_keys=True))
    folder = _images_dir() / f"{kind}-{key[:24]}"
    meta = folder / "image.json"
    if not meta.is_file():
        with _lock():
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
        cached = _cached_layer(spec)
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
        _atomic_write(_images_dir() / "layers" / f"{spec.name}-{spec.key[:24]}.json", json.dumps(record).encode())
        how = "copied" if isinstance(source, Layer) else "built"
        print(f"image layer {spec.name}: {layer.size / 1e6:.1f} MB, {how}", file=sys.stderr, flush=True)
    _atomic_write(folder / "image.json", json.dumps({"name": name, "digest": digest}).encode())
    _prune(kind)
    size = archive.stat().st_size
    print(f"image {name}: {size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# The three images


def _base_spec(cfg: DockerfileConfig) -> LayerSpec:
    debs = resolve_debs(BASE_PACKAGES)
    key = _sha(json.dumps([_builder_source(), "base", [d.__dict__ for d in debs], cfg.account], sort_keys=True))
    return LayerSpec("base", key, _base_layer(cfg.account))


def trainer_config(cfg: DockerfileConfig | None = None) -> dict[str, Any]:
    """The trainer image's OCI config (without rootfs), from docker/Dockerfile's final stage."""
    cfg = cfg or dockerfile_config()
    return _image_config(cfg.user, cfg.env, cfg.workdir, cfg.entrypoint, cfg.cmd)


def trainer_image() -> Image:
    """The trainer test image (built on first use, then cached by the hash of its inputs)."""
    cfg = dockerfile_config()
    stdlib = resolve_debs(STDLIB_PACKAGES)
    python_version = next(d.version for d in resolve_debs(BASE_PACKAGES) if d.package == "python3.11-minimal")
    python_version = python_version.split("-")[0]
    dists, venv_key = _venv_inputs(cfg.pins)
    code = _code_entries(_context_files(cfg.copies), cfg.workdir)
    code_hash = hashlib.sha256()
    for e in code:
        code_hash.update(f"{e.path} {e.kind} {e.mode:o}\n".encode())
        code_hash.update(hashlib.sha256(e.data or b"").digest())
    src = _builder_source()
    specs = [
        _base_spec(cfg),
        LayerSpec("stdlib", _sha(json.dumps([src, "stdlib", [d.__dict__ for d in stdlib]])), _stdlib_layer),
        LayerSpec(
            "venv",
            _sha(json.dumps([src, "venv", cfg.venv_from, python_version, venv_key])),
            _venv_layer(dists, cfg.venv_from, python_version),
        ),
        LayerSpec("code", _sha(json.dumps([src, "code", cfg.workdir, code_hash.hexdigest()])), lambda: code),
    ]
    return _image("trainer", specs, trainer_config(cfg))


def utility_image() -> Image:
    """Small image for init containers: busybox applets, /bin/sh = dash, /bin/nslookup = Python gethostbyname."""
    cfg = dockerfile_config()
    return _image("utility", [_base_spec(cfg)], _image_config("", dict(BASE_ENV), "/", None, ["sh"]))


def pause_image() -> Image:
    """The sandbox image: the pause binary of tools/cluster/pause as /pause, Entrypoint ["/pause"]."""
    try:
        binary = build.binary("pause")
    except build.BuildError as e:
        raise ImageError(f"the pause image needs the pause binary: {e}") from e
    data = binary.read_bytes()
    key = _sha(json.dumps([_builder_source(), "pause", _sha(data)]))
    spec = LayerSpec("pause", key, lambda: [Entry("pause", "file", 0o755, data=data)])
    return _image("pause", [spec], _image_config("", {}, "/", ["/pause"], None))


# ---------------------------------------------------------------------------------------------------
# Reading an archive back (tests, debugging)


def read_archive(archive: Path) -> dict[str, Any]:
    """index, manifest, config and each layer's member name, from an archive this module wrote."""
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
    path = img.archive.with_name(f"delta-{_sha(' '.join(skip))[:16]}.tar")
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
            print(__doc__, file=sys.stderr)
            return 2
    except ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
