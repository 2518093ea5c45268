"""docker/verify_image.py proves that the EFA plugin initialises the way NCCL loads it, not only
that its file exists: `libcudart.so` by its unversioned name (what aws-ofi-nccl 1.21 dlopens), and
the plugin through dlopen(RTLD_NOW) with its ncclNet table resolved.

The real aws-ofi-nccl is only in the image, so the plugin here is a small shared library compiled
by the test with the same exported layout (a table whose first field is the name); the loader,
dlopen and dlsym are the real ones, and libcudart is the real CUDA runtime from the torch wheels.
The Dockerfile test checks the image provides the link and runs the check at build time.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

# Compiles and loads native libraries in real processes.
pytestmark = pytest.mark.slow

SCRIPT = REPO_ROOT / "docker" / "verify_image.py"
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
NCCL = metadata.version("nvidia-nccl-cu13")

PLUGIN_C = """
typedef struct { const char *name; void *init; } table_t;
%(extern)s
static int init(void *logger) { %(call)s return 0; }
__attribute__((visibility("default"))) const table_t ncclNetPlugin_v%(version)d = {"Libfabric", (void *)init};
"""


def cudart_so13() -> Path:
    """The CUDA runtime the torch wheels install (nvidia/cu13/lib), the file the image links to."""
    site = Path(metadata.distribution("torch").locate_file(""))
    found = sorted(site.glob("nvidia/*/lib/libcudart.so.13"))
    assert found, f"no libcudart.so.13 under {site}/nvidia"
    return found[0]


def compile_plugin(tmp: Path, *, version: int = 10, missing_symbol: bool = False) -> Path:
    source = tmp / "plugin.c"
    source.write_text(
        PLUGIN_C
        % {
            "version": version,
            "extern": "extern int fi_getinfo_not_provided(void);" if missing_symbol else "",
            "call": "fi_getinfo_not_provided();" if missing_symbol else "",
        }
    )
    out = tmp / "libnccl-net-ofi.so"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


def verify(plugin: Path, library_path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LD_LIBRARY_PATH": library_path, "NCCL_NET_PLUGIN": "ofi"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--nccl", NCCL, "--efa", "--plugin", str(plugin)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


@pytest.fixture()
def cudart_dir(tmp_path: Path) -> Path:
    """A directory holding `libcudart.so` -> the real libcudart.so.13, as the image arranges it."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcudart.so").symlink_to(cudart_so13())
    return lib


def test_the_unversioned_cudart_loads_and_answers_and_the_plugin_table_resolves(tmp_path, cudart_dir):
    result = verify(compile_plugin(tmp_path), str(cudart_dir))
    assert re.search(
        r"^ok: dlopen\('libcudart.so'\) -> \['.*libcudart\.so\.13'\]: cudaRuntimeGetVersion = 13\d{3}",
        result.stdout,
        re.M,
    ), result.stdout
    assert "ok: ncclNet plugin tables: [\"v10 'Libfabric'\"]" in result.stdout, result.stdout
    assert re.search(r"^ok: dlopen\('.*libnccl-net-ofi\.so', RTLD_NOW\): every symbol resolved", result.stdout, re.M)


def test_without_the_unversioned_cudart_the_check_fails(tmp_path):
    """The image before the fix: only libcudart.so.13 exists, so the plugin cannot load cudart."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcudart.so.13").symlink_to(cudart_so13())
    result = verify(compile_plugin(tmp_path), str(lib))
    assert result.returncode == 1
    assert "FAIL: dlopen('libcudart.so') failed" in result.stdout, result.stdout


def test_a_plugin_with_an_unresolved_symbol_fails_like_nccl_would_drop_it(tmp_path, cudart_dir):
    result = verify(compile_plugin(tmp_path, missing_symbol=True), str(cudart_dir))
    assert result.returncode == 1
    assert re.search(
        r"^FAIL: dlopen\('.*libnccl-net-ofi\.so', RTLD_NOW\) failed: .*fi_getinfo_not_provided", result.stdout, re.M
    ), result.stdout


def test_a_plugin_without_an_ncclnet_table_fails(tmp_path, cudart_dir):
    result = verify(compile_plugin(tmp_path, version=3), str(cudart_dir))
    assert result.returncode == 1
    assert "FAIL: ncclNet plugin tables: none" in result.stdout, result.stdout


def test_the_dockerfile_links_the_unversioned_cudart_and_runs_the_plugin_check():
    text = DOCKERFILE.read_text()
    link = re.search(r'ln -s "\$\{cudart\}" (?P<dir>\S+)/libcudart\.so\b', text)
    assert link, "the image must provide libcudart.so"
    ld_path = re.search(r"LD_LIBRARY_PATH=(\S+)", text).group(1).split(":")
    assert link.group("dir") in ld_path, (link.group("dir"), ld_path)
    # The check runs after the link and with --efa, so a missing link fails the build.
    check = text.index('verify_image.py --nccl "${NCCL_VERSION}" --efa')
    assert text.index("ln -s") < check
