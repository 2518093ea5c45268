"""The Python side of the trainer image: /opt/venv, packed from the environment this module runs in (the
distributions the Dockerfile's pip line names, with their dependencies, checked against its pins, GPU-only
files left out), and the code layer, the files the Dockerfile's final stage COPYs from the build context."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import importlib.metadata as metadata
import os
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from tools.cluster.image.common import PYTHON, REPO_ROOT, ImageError, canonical
from tools.cluster.image.layers import Entry

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


def venv_distributions(pins: dict[str, str]) -> list[metadata.Distribution]:
    """The installed distributions the pinned packages need (their requirements, extras followed),
    checked against the pins; sorted by name."""
    # packaging (a dependency of pip's own tooling, in every environment that installed the pins)
    requirement = importlib.import_module("packaging.requirements").Requirement

    if sys.version_info[:2] != tuple(int(x) for x in PYTHON.split(".")):
        raise ImageError(f"the image's /opt/venv is packed from this environment, which must be Python {PYTHON}")
    installed = {canonical(d.metadata["Name"]): d for d in metadata.distributions()}
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
        name = canonical(name)
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


def venv_inputs(pins: dict[str, str]) -> tuple[list[metadata.Distribution], str]:
    dists = venv_distributions(pins)
    h = hashlib.sha256()
    for d in dists:
        h.update(f"{canonical(d.metadata['Name'])}=={d.version}\n".encode())
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


def venv_layer(dists: list[metadata.Distribution], venv: str, python_version: str) -> Callable[[], list[Entry]]:
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


def context_files(copies: list[tuple[str, str]]) -> list[tuple[str, Path]]:
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


def code_entries(files: list[tuple[str, Path]], workdir: str) -> list[Entry]:
    """The code layer's entries, read once: the cache key hashes exactly the bytes that are packed,
    even while someone edits trainer/."""
    entries = [Entry(workdir.strip("/"), "dir")]
    for target, path in files:
        mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
        entries.append(Entry(target, "file", mode, data=path.read_bytes()))
    return entries


def code_layer(files: list[tuple[str, Path]], workdir: str) -> Callable[[], list[Entry]]:
    entries = code_entries(files, workdir)
    return lambda: entries
