"""Prove which NCCL torch loads, and that the EFA plugin loads the way NCCL loads it.

Runs at image build time (docker/Dockerfile fails the build on any mismatch) and on demand:

    docker run --rm IMAGE python /opt/fsdp/verify_image.py --nccl 2.28.9 --efa

Checks, each printed as `ok: ...` or `FAIL: ...` (exit 1 on any failure):
  1. the nvidia-nccl-cu13 distribution installed is the pinned version, and torch's own metadata
     requires exactly that version (torch was built against it);
  2. after `import torch`, exactly one libnccl.so.2 is mapped into the process, and it is the file
     that distribution installed (not a system copy found through LD_LIBRARY_PATH or LD_PRELOAD);
  3. torch.cuda.nccl.version() (ncclGetVersion of the loaded library) equals the pin;
  4. with --efa: NCCL_NET_PLUGIN names the aws-ofi-nccl plugin, the plugin library sits in a
     directory on LD_LIBRARY_PATH, and libfabric is installed;
  5. with --efa: `libcudart.so`, by that exact unversioned name, loads and answers
     cudaRuntimeGetVersion (aws-ofi-nccl 1.21 dlopens that name when NCCL initialises it, and
     without it NCCL silently falls back to TCP sockets);
  6. with --efa: the plugin loads as NCCL loads it (dlopen with RTLD_NOW, so every library and
     symbol it needs must resolve: libfabric, hwloc, libstdc++ ...) and exports an ncclNet plugin
     table of a version NCCL searches for, whose name field reads back; ncclCollNet tables are
     listed (aws-ofi-nccl has none on purpose: EFA offers no in-network reduction).
No GPU is needed: loading NCCL, cudart and the plugin and asking versions does not touch a device.
Calling the plugin's init() is left to the first run (NCCL_DEBUG=INFO): it opens the EFA devices,
which a build machine does not have.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata as metadata
import os
import re
import sys
from pathlib import Path

NCCL_DIST = "nvidia-nccl-cu13"
NCCL_SONAME = "libnccl.so.2"
PLUGIN_DIR = Path("/opt/amazon/ofi-nccl/lib")
LIBFABRIC = Path("/opt/amazon/efa/lib/libfabric.so.1")
# The name aws-ofi-nccl 1.21.x passes to dlopen (aws/aws-ofi-nccl#244); the CUDA images ship only
# the versioned libcudart.so.<major>, the unversioned name comes from -dev packages.
CUDART_NAME = "libcudart.so"
# Plugin table versions NCCL 2.2x looks for, newest first (ncclNetPlugin_v<N> / ncclCollNetPlugin_v<N>).
NET_VERSIONS = tuple(range(12, 5, -1))


def parse_version(text: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+\.\d+\.\d+", text):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR.PATCH, got {text!r}")
    return tuple(int(part) for part in text.split("."))


def mapped_libraries(name: str, prefix: bool = False) -> set[str]:
    """Real paths of the shared objects called `name` (or, with prefix, starting so) mapped into this process."""
    paths = set()
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            base = Path(fields[5].strip()).name if len(fields) == 6 else ""
            if base == name or (prefix and base.startswith(name)):
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
    results.append(
        (
            len(loaded) == 1 and loaded <= shipped,
            f"{NCCL_SONAME} mapped from {sorted(loaded) or 'nowhere'}; {NCCL_DIST} ships {sorted(shipped)}",
        )
    )
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


def check_cudart() -> list[tuple[bool, str]]:
    try:
        cudart = ctypes.CDLL(CUDART_NAME, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as err:
        return [
            (
                False,
                f"dlopen({CUDART_NAME!r}) failed: {err}; link it to the libcudart.so.<major> torch uses, "
                "in a directory on LD_LIBRARY_PATH",
            )
        ]
    version = ctypes.c_int(0)
    status = cudart.cudaRuntimeGetVersion(ctypes.byref(version))
    mapped = sorted(mapped_libraries("libcudart.so.", prefix=True))
    return [
        (
            status == 0 and version.value > 0,
            f"dlopen({CUDART_NAME!r}) -> {mapped}: cudaRuntimeGetVersion = {version.value} (status {status})",
        )
    ]


def plugin_tables(lib: ctypes.CDLL, kind: str) -> list[tuple[int, str]]:
    """(version, name field) of every `nccl<kind>Plugin_v<N>` table the library exports."""
    found = []
    for version in NET_VERSIONS:
        try:
            # Every ncclNet/ncclCollNet table starts with `const char *name`.
            name = ctypes.c_char_p.in_dll(lib, f"nccl{kind}Plugin_v{version}").value
        except ValueError:
            continue
        found.append((version, (name or b"").decode("ascii", "replace")))
    return found


def check_plugin(library: Path) -> list[tuple[bool, str]]:
    try:
        lib = ctypes.CDLL(str(library), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as err:
        return [(False, f"dlopen({str(library)!r}, RTLD_NOW) failed: {err}")]
    net, coll = plugin_tables(lib, "Net"), plugin_tables(lib, "CollNet")
    return [
        (True, f"dlopen({str(library)!r}, RTLD_NOW): every symbol resolved"),
        (
            bool(net) and all(name for _, name in net),
            f"ncclNet plugin tables: {[f'v{v} {n!r}' for v, n in net] or 'none'} "
            f"(NCCL searches v{NET_VERSIONS[0]}..v{NET_VERSIONS[-1]})",
        ),
        (True, f"ncclCollNet plugin tables: {[f'v{v} {n!r}' for v, n in coll] or 'none'}"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nccl", type=parse_version, required=True, help="pinned NCCL version, e.g. 2.28.9")
    parser.add_argument("--efa", action="store_true", help="also check the aws-ofi-nccl plugin and libfabric")
    parser.add_argument(
        "--plugin",
        type=Path,
        default=None,
        help="plugin library to load (default: libnccl-net-$NCCL_NET_PLUGIN.so in the plugin directory)",
    )
    args = parser.parse_args(argv)
    results = check_nccl(args.nccl)
    if args.efa:
        plugin = args.plugin or PLUGIN_DIR / f"libnccl-net-{os.environ.get('NCCL_NET_PLUGIN', '')}.so"
        results += check_efa() + check_cudart() + check_plugin(plugin)
    for passed, message in results:
        print(f"{'ok' if passed else 'FAIL'}: {message}")
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
