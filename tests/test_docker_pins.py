"""The trainer image and the Python requirements pin the same versions.

docker/Dockerfile installs the trainer's packages with exact pins; requirements/*.txt pins the
same packages for tests and CI. A pin changed in one place only must fail here, so the image
never runs different code from what the test suite ran.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import shutil
from pathlib import Path

import pytest
from support import REPO_ROOT

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
REQUIREMENTS = REPO_ROOT / "requirements" / "test.txt"

PIN = re.compile(r"""["']?([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)["']?""")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile_lines(text: str) -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG defaults; an ARG repeated in several stages must have one default everywhere."""
    args: dict[str, str] = {}
    for line in dockerfile_lines(text):
        match = re.fullmatch(r"ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)", line)
        if not match:
            continue
        name, value = match.groups()
        if args.setdefault(name, value) != value:
            raise ValueError(f"ARG {name} has two defaults: {args[name]} and {value}")
    return args


def dockerfile_pins(text: str) -> dict[str, str]:
    """{canonical package name: version} from every `pip install` in the Dockerfile."""
    args = dockerfile_args(text)
    pins: dict[str, str] = {}
    for line in dockerfile_lines(text):
        if not line.startswith("RUN") or "pip install" not in line:
            continue
        expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), line)
        for segment in expanded.split("&&"):
            if "pip install" in segment:
                for name, version in PIN.findall(segment):
                    pins[canonical(name)] = version
    return pins


def requirement_pins(path: Path) -> dict[str, str]:
    """{canonical package name: version} from a requirements file and the files it includes."""
    pins: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            pins.update(requirement_pins(path.parent / line[3:].strip()))
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if not match:
            raise ValueError(f"{path}: {raw!r} is not an exact pin (name==version)")
        pins[canonical(match.group(1))] = match.group(2)
    return pins


def pin_mismatches(dockerfile_text: str, requirements: Path) -> list[str]:
    """One message per image pin that the requirements lack or pin to another version."""
    wanted = requirement_pins(requirements)
    problems = []
    for name, version in sorted(dockerfile_pins(dockerfile_text).items()):
        if name not in wanted:
            problems.append(f"{name}=={version} is pinned in the Dockerfile but not in {requirements.name}")
        elif wanted[name] != version:
            problems.append(f"{name}: Dockerfile pins {version}, {requirements.name} pins {wanted[name]}")
    return problems


def test_dockerfile_installs_the_trainer_packages_with_exact_pins():
    pins = dockerfile_pins(DOCKERFILE.read_text())
    for package in ("torch", "transformers", "safetensors", "nvidia-nccl-cu13", "prometheus-client", "pyyaml"):
        assert package in pins, f"docker/Dockerfile does not pin {package}"


def test_dockerfile_and_requirements_agree():
    assert pin_mismatches(DOCKERFILE.read_text(), REQUIREMENTS) == []


def test_a_pin_changed_only_in_the_dockerfile_fails(tmp_path):
    mutated = tmp_path / "Dockerfile"
    mutated.write_text(DOCKERFILE.read_text().replace("torch==2.11.0", "torch==2.10.0"))
    assert mutated.read_text() != DOCKERFILE.read_text(), "the mutation must change the copy"
    assert pin_mismatches(mutated.read_text(), REQUIREMENTS) == ["torch: Dockerfile pins 2.10.0, test.txt pins 2.11.0"]


def test_a_pin_changed_only_in_the_requirements_fails(tmp_path):
    shutil.copytree(REQUIREMENTS.parent, tmp_path / "requirements")
    mutated = tmp_path / "requirements" / "test.txt"
    mutated.write_text(mutated.read_text().replace("transformers==5.17.0", "transformers==5.18.0"))
    assert pin_mismatches(DOCKERFILE.read_text(), mutated) == [
        "transformers: Dockerfile pins 5.17.0, test.txt pins 5.18.0"
    ]


def test_the_nccl_arg_changed_in_one_stage_only_fails(tmp_path):
    text = DOCKERFILE.read_text()
    assert text.count("ARG NCCL_VERSION=2.28.9") == 2, "both stages declare the NCCL pin"
    mutated = text.replace("ARG NCCL_VERSION=2.28.9", "ARG NCCL_VERSION=2.29.1", 1)
    with pytest.raises(ValueError, match="ARG NCCL_VERSION has two defaults: 2.29.1 and 2.28.9"):
        dockerfile_pins(mutated)


def test_the_pinned_nccl_is_the_one_the_pinned_torch_declares():
    """torch's wheel metadata pins its NCCL exactly: a torch bump without an NCCL bump fails here."""
    nccl = dockerfile_pins(DOCKERFILE.read_text())["nvidia-nccl-cu13"]
    assert metadata.version("torch") == requirement_pins(REQUIREMENTS)["torch"], "reinstall: bash tools/setup.sh test"
    declared = [r for r in metadata.requires("torch") or [] if r.startswith("nvidia-nccl-cu13")]
    assert declared and declared[0].split(";")[0].replace(" ", "") == f"nvidia-nccl-cu13=={nccl}", declared


def test_the_cuda_base_image_is_the_cuda_the_pinned_torch_is_built_for():
    args = dockerfile_args(DOCKERFILE.read_text())
    match = re.fullmatch(r"nvidia/cuda:(\d+\.\d+\.\d+)-base-ubuntu24\.04", args["CUDA_IMAGE"])
    assert match, f"CUDA_IMAGE {args['CUDA_IMAGE']} is not an exact nvidia/cuda base tag"
    declared = [r for r in metadata.requires("torch") or [] if r.startswith("cuda-toolkit")]
    assert declared, "torch declares no cuda-toolkit requirement"
    assert f"=={match.group(1)}" in declared[0], f"base image CUDA {match.group(1)} but torch wants {declared[0]}"
