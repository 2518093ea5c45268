"""The real test images (tools/cluster/image/), built from Debian packages, the installed pins and trainer/.

Builds (or finds in the cache) the trainer, utility and pause images and reads their archives back:
every blob's digest and size as the manifest says, diff_ids equal to the (uncompressed) layer
digests, the config docker/Dockerfile's final stage gives, the user and group, the init containers'
commands, the trainer's files, the pinned packages; and that rebuilding a layer from the same inputs
gives the same digest. No root needed; a cold build downloads about 10 MB of Debian packages
(apt-get download) and writes a multi-GB trainer archive (minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from tools.cluster import image

pytestmark = pytest.mark.slow


class NullSink:
    def write(self, data: bytes | memoryview) -> None:
        pass


@pytest.fixture(scope="module")
def trainer() -> image.Image:
    return image.trainer_image()


@pytest.fixture(scope="module")
def utility() -> image.Image:
    return image.utility_image()


def blobs_check(archive: Path) -> dict[str, Any]:
    """Every blob hashes to its name; returns the archive's index, manifest and config."""
    info = image.read_archive(archive)
    sizes = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            if not (member.isfile() and member.name.startswith("blobs/sha256/")):
                continue
            h = hashlib.sha256()
            f = tar.extractfile(member)
            assert f is not None
            while chunk := f.read(1 << 22):
                h.update(chunk)
            assert h.hexdigest() == member.name.rsplit("/", 1)[1], member.name
            sizes["sha256:" + h.hexdigest()] = member.size
    manifest = info["manifest"]
    for desc in [manifest["config"], *manifest["layers"]]:
        assert sizes[desc["digest"]] == desc["size"]
    assert info["config"]["rootfs"]["diff_ids"] == [la["digest"] for la in manifest["layers"]]
    assert info["index"]["manifests"][0]["size"] == sizes[info["index"]["manifests"][0]["digest"]]
    return info


def layer_files(archive: Path, digest: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        f = tar.extractfile(f"blobs/sha256/{digest[7:]}")
        assert f is not None
        with tarfile.open(fileobj=f, mode="r:") as layer:
            return {m.name.rstrip("/"): m for m in layer}


def layer_text(archive: Path, digest: str, path: str) -> str:
    with tarfile.open(archive) as tar:
        f = tar.extractfile(f"blobs/sha256/{digest[7:]}")
        assert f is not None
        with tarfile.open(fileobj=f, mode="r:") as layer:
            member = layer.extractfile(path)
            assert member is not None
            return member.read().decode()


def test_trainer_archive(trainer: image.Image) -> None:
    info = blobs_check(trainer.archive)
    assert re.fullmatch(r"localhost/fsdp-gitops/trainer:test-[0-9a-f]{12}", trainer.name)
    assert trainer.tag != "latest" and trainer.repository == "localhost/fsdp-gitops/trainer"
    assert info["index"]["manifests"][0]["digest"] == trainer.digest
    assert info["index"]["manifests"][0]["annotations"]["io.containerd.image.name"] == trainer.name
    # The image config is the one docker/Dockerfile gives (tests/test_image_dockerfile.py reads that).
    assert info["config"]["config"] == image.trainer_config()["config"]
    assert len(info["manifest"]["layers"]) == 4


def test_trainer_layers_hold_the_user_the_venv_and_the_code(trainer: image.Image) -> None:
    base, stdlib, venv, code = (la["digest"] for la in image.read_archive(trainer.archive)["manifest"]["layers"])
    passwd = layer_text(trainer.archive, base, "etc/passwd")
    assert "trainer:x:10001:10001::/home/trainer:/bin/sh" in passwd.splitlines()
    assert "trainer:x:10001:" in layer_text(trainer.archive, base, "etc/group").splitlines()
    files = layer_files(trainer.archive, base)
    assert (files["home/trainer"].uid, files["home/trainer"].gid) == (10001, 10001)
    assert files["bin/sh"].linkname == "dash" and files["tmp"].mode == 0o1777
    assert "usr/lib/python3.11/json/__init__.py" in layer_files(trainer.archive, stdlib)
    freeze = layer_text(trainer.archive, venv, "opt/venv/pip-freeze.txt").lower().splitlines()
    for name, version in image.dockerfile_config().pins.items():
        assert any(
            image.canonical(line.split("==")[0]) + "==" + line.split("==")[1] == f"{name}=={version}" for line in freeze
        ), name
    venv_files = layer_files(trainer.archive, venv)
    assert venv_files["opt/venv/bin/python3"].linkname == "/usr/bin/python3.11"
    assert "opt/venv/lib/python3.11/site-packages/torch/__init__.py" in venv_files
    assert "opt/venv/bin/torchrun" in venv_files
    assert not [n for n in venv_files if n.endswith(".a") or "/torch/include/" in n]  # GPU-only files left out
    code_files = layer_files(trainer.archive, code)
    expected = {
        f"opt/fsdp/trainer/{p.relative_to(REPO_ROOT / 'trainer').as_posix()}"
        for p in (REPO_ROOT / "trainer").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert expected <= set(code_files) and "opt/fsdp/verify_image.py" in code_files
    assert not [n for n in code_files if "__pycache__" in n]
    assert all(m.uid == 0 and m.mtime == image.EPOCH for m in code_files.values())


def init_container_commands() -> set[str]:
    """The commands the manifests' busybox init containers run (wait-for-data), plus the operator's
    wait-for-master loop (seq, nslookup, sleep)."""
    job = yaml.safe_load((REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml").read_text())
    (init,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["initContainers"]
    assert init["image"].startswith("docker.io/library/busybox:"), "the utility image stands in for busybox"
    words = set()
    for line in init["command"][-1].splitlines():
        previous = None
        for token in shlex.shlex(line, posix=True, punctuation_chars=True):
            if previous in (None, ";", "&&", "||", "|", "(", "((", "{", "then", "do", "else", "!") and "=" not in token:
                words.add(token)
            previous = token
    keywords = {"until", "while", "do", "done", "then", "fi", "if", "exit", "(", "((", "{", "$", "}"}
    return (words - keywords) | {"sh", "seq", "nslookup", "sleep"}


def test_utility_image_runs_the_init_containers_commands(utility: image.Image, trainer: image.Image) -> None:
    info = blobs_check(utility.archive)
    assert re.fullmatch(r"localhost/fsdp-gitops/utility:test-[0-9a-f]{12}", utility.name)
    (layer,) = info["manifest"]["layers"]
    trainer_base = image.read_archive(trainer.archive)["manifest"]["layers"][0]
    assert layer == trainer_base  # one shared layer: containerd stores and unpacks it once
    assert info["config"]["config"]["Cmd"] == ["sh"]
    files = layer_files(utility.archive, layer["digest"])
    commands = init_container_commands()
    assert {"date", "echo", "sleep", "[", "sh", "nslookup", "seq"} <= commands
    for command in commands:
        found = [files.get(f"{d}/{command}") for d in ("bin", "usr/bin", "sbin", "usr/sbin")]
        assert any(found), f"{command} missing from the utility image"
    assert files["bin/sh"].linkname == "dash"
    nslookup = layer_text(utility.archive, layer["digest"], "bin/nslookup")
    assert nslookup.startswith("#!/usr/bin/python3.11\n") and "gethostbyname" in nslookup
    assert not [n for n in files if n.endswith("/nslookup") and n != "bin/nslookup"]


def test_pause_image() -> None:
    pause = image.pause_image()
    info = blobs_check(pause.archive)
    assert info["config"]["config"]["Entrypoint"] == ["/pause"]
    (layer,) = info["manifest"]["layers"]
    files = layer_files(pause.archive, layer["digest"])
    assert files["pause"].mode == 0o755 and files["pause"].size > 0


def test_warm_call_returns_the_cached_image(trainer: image.Image) -> None:
    assert image.trainer_image() == trainer


def test_layers_rebuild_to_the_same_digest(trainer: image.Image) -> None:
    """Same inputs, same bytes: each layer written again from its inputs hashes to the cached digest
    (the 4-GB Python layer too, hashed without being written)."""
    cached = image.read_archive(trainer.archive)["manifest"]["layers"]
    cfg = image.dockerfile_config()
    python_version = next(d.version for d in image.resolve_debs(image.BASE_PACKAGES) if d.package.startswith("python"))
    dists, _ = image.venv_inputs(cfg.pins)
    makers = [
        image.base_layer(cfg.account),
        image.stdlib_layer,
        image.venv_layer(dists, cfg.venv_from, python_version.split("-")[0]),
        image.code_layer(image.context_files(cfg.copies), cfg.workdir),
    ]
    for make, layer in zip(makers, cached, strict=True):
        assert image.write_layer(make(), NullSink()) == (layer["digest"], layer["size"])  # type: ignore[arg-type]


def test_print_command(trainer: image.Image, capsys: pytest.CaptureFixture[str]) -> None:
    assert image.main(["--print"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == trainer.name and out["digest"] == trainer.digest and len(out["layers"]) == 4
