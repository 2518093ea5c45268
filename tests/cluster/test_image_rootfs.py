"""The test images run: their file systems, unpacked, as the image's user, and their archives in containerd.

The trainer image's layers are unpacked into a folder and its programs run there with chroot, in a
private mount and PID namespace (a fresh /proc, the host's /dev and /etc/hosts, as a runtime gives a
container), as uid/gid 10001 with exactly the image config's environment and working directory:
the trainer imports, answers --help, trains the tiny model under torchrun (gloo, 2 processes) and
writes checkpoints and metrics; prepare_data stages a local dataset. The utility image runs the
wait-for-data init container's script from base/pytorchjob and the operator's wait-for-master loop.
containerd (the harness's pinned build) imports the utility and pause archives with
`ctr -n k8s.io images import` under the names and digests the builder reports (the trainer archive
is written by the same code; the real-pods level imports it).

Needs root (chroot, namespaces, mounts): the real-pods tier.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from tools.cluster import build, image

pytestmark = [pytest.mark.realpods, pytest.mark.slow]


if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("chroot") is None:
    pytest.skip("needs root with unshare and chroot to run the images' programs", allow_module_level=True)


def unpacked(img: image.Image) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="image-rootfs-", dir="/tmp"))
    try:
        image.unpack(img.archive, root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def trainer_root() -> Iterator[Path]:
    yield from unpacked(image.trainer_image())


@pytest.fixture(scope="module")
def utility_root() -> Iterator[Path]:
    yield from unpacked(image.utility_image())


def run_in(
    root: Path, img: image.Image, script: str, user: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`sh -c script` in the unpacked image as its config says (user, env, working directory)."""
    config = image.read_archive(img.archive)["config"]["config"]
    user = user or config.get("User", "0:0")
    workdir = config.get("WorkingDir", "/")
    mounts = (
        f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && "
        f"touch {root}/etc/hosts && mount --bind /etc/hosts {root}/etc/hosts"
    )
    inner = f"cd {workdir} && {script}"
    chroot = ["chroot", f"--userspec={user}", str(root), "/bin/sh", "-c", inner]
    command = f"{mounts} && exec env -i {' '.join(map(_quote, config['Env']))} {' '.join(map(_quote, chroot))}"
    return subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def workdir(root: Path, name: str) -> Path:
    """A folder under the image's /tmp owned by the image's user, like a writable volume."""
    path = root / "tmp" / name
    path.mkdir(parents=True)
    os.chown(path, 10001, 10001)
    return path


def test_trainer_imports_as_the_images_user(trainer_root: Path) -> None:
    img = image.trainer_image()
    modules = "torch, transformers, datasets, torchao, safetensors, prometheus_client, etcd, yaml, trainer.train"
    proc = run_in(
        trainer_root,
        img,
        f"id -u; id -g; pwd; echo $HOME; python -c 'import {modules}, trainer.launch, trainer.prepare_data; "
        "import sys, torch; print(sys.executable, torch.__version__)' && python -m trainer.train --help",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    uid, gid, cwd, home, versions, *help_text = proc.stdout.splitlines()
    assert (uid, gid, cwd, home) == ("10001", "10001", "/opt/fsdp", "/home/trainer")
    assert versions.startswith("/opt/venv/bin/python 2.11.0")
    assert help_text[0].startswith("usage: python -m trainer.train")


def test_trainer_trains_in_the_image(trainer_root: Path) -> None:
    img = image.trainer_image()
    work = workdir(trainer_root, "train")
    shutil.copy(REPO_ROOT / "tests" / "data" / "samsum_tiny.jsonl", work / "samsum.jsonl")
    overrides = (
        "training.max_steps=3 data.path=/tmp/train/samsum.jsonl checkpoint.dir=/tmp/train/ckpt "
        "metrics.output_dir=/tmp/train/metrics checkpoint.export_dir= checkpoint.interval_steps=2"
    )
    proc = run_in(
        trainer_root,
        img,
        "OMP_NUM_THREADS=1 exec torchrun --standalone --nproc_per_node=2 -m trainer.train "
        f"--config trainer/configs/tiny.yaml {overrides}",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "step 3 loss" in proc.stdout
    checkpoints = sorted(p.name for p in (work / "ckpt").iterdir())
    assert checkpoints == ["step-00000002", "step-00000003"]
    metrics = work / "metrics" / "metrics.jsonl"
    assert metrics.stat().st_uid == 10001 and len(metrics.read_text().splitlines()) >= 3


def test_prepare_data_in_the_image(trainer_root: Path) -> None:
    img = image.trainer_image()
    work = workdir(trainer_root, "stage")
    (work / "src").mkdir()
    shutil.copy(REPO_ROOT / "tests" / "data" / "samsum_tiny.jsonl", work / "src" / "train.jsonl")
    proc = run_in(
        trainer_root,
        img,
        "python -m trainer.prepare_data --dataset /tmp/stage/src --format samsum --out /tmp/stage/data",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (work / "data" / "_COMPLETE").stat().st_uid == 10001


def test_utility_image_runs_the_init_containers(utility_root: Path) -> None:
    img = image.utility_image()
    job = yaml.safe_load((REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml").read_text())
    (init,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["sh", "-c"]
    marker = workdir(utility_root, "shared") / "_COMPLETE"
    marker.write_text("done\n")
    script = f"export DATA_MARKER=/tmp/shared/_COMPLETE; {init['command'][2]}"
    proc = run_in(utility_root, img, script, user="10001:10001", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The Training Operator's wait-for-master init container (v1.9), with a name that resolves.
    loop = (
        "err=1; for i in $(seq 3); do if nslookup localhost; then err=0 && break; fi; "
        "echo waiting for master; sleep 1; done; exit $err"
    )
    proc = run_in(utility_root, img, loop, user="10001:10001", timeout=60)
    assert proc.returncode == 0 and "Address: 127.0.0.1" in proc.stdout, proc.stdout + proc.stderr
    proc = run_in(utility_root, img, "nslookup no-such-name.invalid", user="10001:10001", timeout=60)
    assert proc.returncode == 1 and "can't resolve" in proc.stderr


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Path]:
    """A containerd of the harness's build on a socket in tmp_path, its /run a private tmpfs."""
    binary = build.binary("containerd")
    (tmp_path / "config.toml").write_text(
        f'version = 3\nroot = "{tmp_path}/root"\nstate = "{tmp_path}/state"\n'
        f'[grpc]\n  address = "{tmp_path}/containerd.sock"\n[ttrpc]\n  address = "{tmp_path}/containerd.sock.ttrpc"\n'
    )
    script = f"mount -t tmpfs tmpfs /run && exec {binary} --config {tmp_path}/config.toml"
    with open(tmp_path / "containerd.log", "w") as log:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    socket = tmp_path / "containerd.sock"
    try:
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "containerd.log").read_text()
            time.sleep(0.2)
        yield socket
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_containerd_imports_the_archives(containerd: Path, tmp_path: Path) -> None:
    ctr = [str(build.binary("ctr")), "--address", str(containerd), "-n", "k8s.io"]
    for img in (image.utility_image(), image.pause_image()):
        proc = subprocess.run([*ctr, "images", "import", str(img.archive)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        listing = subprocess.run([*ctr, "images", "ls"], capture_output=True, text=True, check=True).stdout
        rows = {line.split()[0]: line.split()[2] for line in listing.splitlines()[1:]}
        assert rows[img.name] == img.digest, listing
    # An image whose first layer containerd already holds, imported from the archive without that blob.
    utility = image.utility_image()
    info = image.read_archive(utility.archive)
    with tarfile.open(utility.archive) as tar:
        (base,) = info["manifest"]["layers"]
        offset = tar.getmember(f"blobs/sha256/{base['digest'][7:]}").offset_data
    sources = [
        image.Layer(utility.archive, base["digest"], base["size"], offset),
        lambda: [image.Entry("opt/new", "file", data=b"new")],
    ]
    archive = tmp_path / "changed.tar"
    with open(archive, "wb") as out:
        digest, _ = image.write_archive(out, "localhost/fsdp-gitops/changed:test-1", sources, info["config"])
    delta = image.delta_archive(image.Image(archive, "localhost/fsdp-gitops/changed:test-1", digest), [base["digest"]])
    assert delta.stat().st_size < base["size"]
    proc = subprocess.run([*ctr, "images", "import", str(delta)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run([*ctr, "images", "check"], capture_output=True, text=True, check=True).stdout
    assert any(
        line.startswith("localhost/fsdp-gitops/changed:test-1 ") and "complete (3/3)" in line
        for line in check.splitlines()
    ), check
