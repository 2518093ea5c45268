"""docker/verify_image.py proves which NCCL torch loads (the image build runs it; here on CPU)."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

# Every test runs the image check in real processes against real libraries.
pytestmark = pytest.mark.slow

SCRIPT = REPO_ROOT / "docker" / "verify_image.py"
NCCL = metadata.version("nvidia-nccl-cu13")


def verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_the_installed_nccl_is_proven_to_be_the_one_torch_loads():
    result = verify("--nccl", NCCL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: torch.cuda.nccl.version()" in result.stdout
    assert f"{os.sep}nvidia{os.sep}nccl{os.sep}lib{os.sep}libnccl.so.2" in result.stdout


def test_a_different_pin_fails_and_names_the_loaded_version():
    result = verify("--nccl", "2.27.3")
    assert result.returncode == 1
    assert "FAIL: torch.cuda.nccl.version()" in result.stdout and "(2, 27, 3)" in result.stdout


def test_a_shadowing_libnccl_is_detected(tmp_path):
    """A libnccl.so.2 loaded from elsewhere (here LD_PRELOAD of a copy) is not the pinned file."""
    shipped = Path(metadata.distribution("nvidia-nccl-cu13").locate_file("nvidia/nccl/lib/libnccl.so.2"))
    shadow = tmp_path / "libnccl.so.2"
    try:
        os.link(shipped, shadow)
    except OSError:
        shutil.copy(shipped, shadow)
    result = verify("--nccl", NCCL, env={"LD_PRELOAD": str(shadow)})
    assert result.returncode == 1, result.stdout
    assert f"FAIL: libnccl.so.2 mapped from ['{shadow}']" in result.stdout


def test_the_efa_checks_fail_outside_the_image():
    result = verify("--nccl", NCCL, "--efa", env={"NCCL_NET_PLUGIN": "", "LD_LIBRARY_PATH": ""})
    assert result.returncode == 1
    assert "FAIL: NCCL_NET_PLUGIN=''" in result.stdout
