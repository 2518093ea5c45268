"""The shared volume's ownership Job, run for real: its container command as a root process holding only
the capabilities its securityContext adds (setpriv bounding set), against a directory that is
root:root 0755 like a new FSx file system's root. Afterwards the trainer's uid 10001 (without any
capability or supplementary group) writes in every folder; before, it cannot. Each of the three
capabilities is needed: without any one of them the command fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

pytestmark = pytest.mark.realpods

JOB = yaml.safe_load((REPO_ROOT / "base" / "shared-storage" / "job.yaml").read_text())
CONTAINER = JOB["spec"]["template"]["spec"]["containers"][0]
CAPS = [c.lower() for c in CONTAINER["securityContext"]["capabilities"]["add"]]
UID = 10001

if os.geteuid() != 0 or shutil.which("setpriv") is None:
    pytest.skip(
        "needs root and setpriv (util-linux) to run as another uid with chosen capabilities", allow_module_level=True
    )


@pytest.fixture
def volume() -> Iterator[Path]:
    # Not under pytest's tmp_path: its parents are 0700, which uid 10001 could not traverse.
    top = Path(tempfile.mkdtemp(prefix="fsx-root-", dir="/tmp"))
    top.chmod(0o755)
    root = top / "shared"
    root.mkdir()
    os.chown(root, 0, 0)
    root.chmod(0o755)
    yield root
    shutil.rmtree(top)


def run_job(root: Path, caps: list[str]) -> subprocess.CompletedProcess:
    """The container's command (sh -c script name folders...) as root with only `caps`."""
    env = {"PATH": "/usr/bin:/bin", **{e["name"]: e["value"] for e in CONTAINER["env"]}, "SHARED_ROOT": str(root)}
    bounding = ",".join(["-all", *(f"+{c}" for c in caps)])
    return subprocess.run(
        ["setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set={bounding}", *CONTAINER["command"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_trainer(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def folders() -> list[str]:
    return CONTAINER["command"][4:]


def test_the_trainer_cannot_write_to_a_new_fsx_root(volume):
    assert as_trainer("mkdir", str(volume / "checkpoints")).returncode != 0


def test_after_the_job_the_trainer_writes_in_every_folder_and_the_job_is_idempotent(volume):
    for _ in range(2):  # Flux re-creates the Job; the second run finds everything in place
        done = run_job(volume, CAPS)
        assert done.returncode == 0, done.stderr
    for f in folders():
        st = (volume / f).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (UID, UID, 0o775), f
        nested = volume / f / "run-x"
        wrote = as_trainer("sh", "-c", f'mkdir -p "{nested}" && echo ok > "{nested}/file"')
        assert wrote.returncode == 0, f"uid {UID} cannot write in {f}: {wrote.stderr}"
        assert (nested / "file").stat().st_uid == UID and (nested / "file").stat().st_gid == UID
    # The volume's root stays as it was.
    st = volume.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)
    assert done.stdout.count(f"{UID}:{UID} 775") == len(folders())


@pytest.mark.parametrize("missing", CAPS)
def test_each_added_capability_is_needed(volume, missing):
    # A volume a trainer wrote to before (a folder of its own, mode 0755), as after an earlier version.
    existing = volume / "data"
    existing.mkdir()
    os.chown(existing, UID, UID)
    existing.chmod(0o755)
    done = run_job(volume, [c for c in CAPS if c != missing])
    assert done.returncode != 0, f"the Job succeeded without {missing.upper()}: it should not ask for it"
