"""hadolint passes on the trainer Dockerfile, and every rule it is told to ignore says why."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support import REPO_ROOT

from generators.core.gotools import tool

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True, check=False)


def test_hadolint_passes():
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_on_a_known_violation(tmp_path):
    """The linter really runs: an unpinned base image (DL3007) in a copy is reported."""
    mutated = tmp_path / "Dockerfile"
    mutated.write_text(
        DOCKERFILE.read_text()
        .replace("ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04\n", "", 1)
        .replace("FROM ${CUDA_IMAGE} AS python-env", "FROM ubuntu:latest AS python-env")
    )
    result = hadolint(mutated)
    assert result.returncode != 0 and "DL3007" in result.stdout, result.stdout


def test_every_ignored_rule_is_justified_on_the_lines_above():
    lines = DOCKERFILE.read_text().splitlines()
    ignores = [i for i, line in enumerate(lines) if "hadolint ignore" in line]
    assert ignores, "no inline ignores: drop this test's premise or keep the justification rule"
    for index in ignores:
        assert re.fullmatch(r"# hadolint ignore=DL\d{4}(,DL\d{4})*", lines[index].strip()), lines[index]
        above = lines[index - 1].strip()
        assert above.startswith("#") and "hadolint" not in above and len(above) > 20, (
            f"docker/Dockerfile:{index + 1}: an ignore needs a comment saying why on the line above"
        )


def test_the_build_context_holds_what_the_dockerfile_copies():
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore, ".dockerignore should exclude everything by default"
    sources = re.findall(r"^COPY (?!--from)(?:--\S+ )*(\S+) ", DOCKERFILE.read_text(), flags=re.M)
    assert sources, "no COPY from the build context found"
    for source in sources:
        assert f"!{source}" in ignore, f"COPY {source}: .dockerignore does not re-include it"
        assert (REPO_ROOT / source).exists(), f"COPY {source}: no such path in the repository"
