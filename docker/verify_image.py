"""Prove which NCCL torch loads, and that the EFA plugin is where NCCL looks for it.

Runs at image build time (docker/Dockerfile fails the build on any mismatch) and on demand:

    docker run --rm IMAGE python /opt/fsdp/verify_image.py --nccl 2.28.9 --efa

Checks, each printed as `ok: ...` or `FAIL: ...` (exit 1 on any failure):
  1. the nvidia-nccl-cu13 distribution installed is the pinned version, and torch's own metadata
     requires exactly that version (torch was built against it);
  2. after `import torch`, exactly one libnccl.so.2 is mapped into the process, and it is the file
     that distribution installed (not a system copy found through LD_LIBRARY_PATH or LD_PRELOAD);
  3. torch.cuda.nccl.version() (ncclGetVersion of the loaded library) equals the pin;
  4. with --efa: NCCL_NET_PLUGIN names the aws-ofi-nccl plugin, the plugin library sits in a
     directory on LD_LIBRARY_PATH, and libfabric is installed.
No GPU is needed: loading NCCL and asking its version does not touch a device.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import sys
from pathlib import Path

NCCL_DIST = "nvidia-nccl-cu13"
NCCL_SONAME = "libnccl.so.2"
PLUGIN_DIR = Path("/opt/amazon/ofi-nccl/lib")
LIBFABRIC = Path("/opt/amazon/efa/lib/libfabric.so.1")


def parse_version(text: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+\.\d+\.\d+", text):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR.PATCH, got {text!r}")
    return tuple(int(part) for part in text.split("."))


def mapped_libraries(name: str) -> set[str]:
    """Real paths of the shared objects called `name` mapped into this process."""
    paths = set()
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and Path(fields[5].strip()).name == name:
                paths.add(os.path.realpath(fields[5].strip()))
    return paths


def check_nccl(expected: tuple[int, ...]) -> list[tuple[bool, str]]:
    want = ".".join(str(part) for part in expected)
    results: list[tuple[bool, str]] = []
    try:
        dist = metadata.distribution(NCCL_DIST)
    except metadata.PackageNotFoundError:
        return [(False, f"{NCCL_DIST} is not installed; install {NCCL_DIST}=={want}")]
    results.append((dist.version == want, f"{NCCL_DIST} installed version {dist.version} (pinned {want})"))

    torch_requires = [req for req in metadata.requires("torch") or [] if req.startswith(NCCL_DIST)]
    declared = any(re.match(rf"{re.escape(NCCL_DIST)}\s*==\s*{re.escape(want)}\s*(;|$)", req) for req in torch_requires)
    results.append((declared, f"torch declares {torch_requires or 'no ' + NCCL_DIST} (pinned {want})"))

    shipped = {os.path.realpath(dist.locate_file(f)) for f in dist.files or [] if Path(str(f)).name == NCCL_SONAME}

    import torch  # noqa: PLC0415 - imported late: loading it is what is being checked

    loaded = mapped_libraries(NCCL_SONAME)
    results.append((
        len(loaded) == 1 and loaded <= shipped,
        f"{NCCL_SONAME} mapped from {sorted(loaded) or 'nowhere'}; {NCCL_DIST} ships {sorted(shipped)}",
    ))
    version = tuple(torch.cuda.nccl.version())
    results.append((version == expected, f"torch.cuda.nccl.version() = {version} (pinned {expected})"))
    return results


def check_efa() -> list[tuple[bool, str]]:
    plugin = os.environ.get("NCCL_NET_PLUGIN", "")
    library = PLUGIN_DIR / f"libnccl-net-{plugin}.so"
    search = [Path(entry) for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":") if entry]
    return [
        (plugin == "ofi", f"NCCL_NET_PLUGIN={plugin!r} (want 'ofi', the aws-ofi-nccl plugin)"),
        (library.is_file(), f"plugin library {library} {'exists' if library.is_file() else 'is missing'}"),
        (PLUGIN_DIR in search, f"{PLUGIN_DIR} on LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')!r}"),
        (LIBFABRIC.exists(), f"libfabric {LIBFABRIC} {'exists' if LIBFABRIC.exists() else 'is missing'}"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nccl", type=parse_version, required=True, help="pinned NCCL version, e.g. 2.28.9")
    parser.add_argument("--efa", action="store_true", help="also check the aws-ofi-nccl plugin and libfabric")
    args = parser.parse_args(argv)
    results = check_nccl(args.nccl) + (check_efa() if args.efa else [])
    for passed, message in results:
        print(f"{'ok' if passed else 'FAIL'}: {message}")
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
