"""Rotation of checkpoint.dir on a volume that is just big enough, and the start check of its space on
one that is too small (trainer/storage.py), with the real trainer (tiny config, 2 CPU ranks, through
`python -m trainer.launch`) and checkpoint.dir on a size-limited tmpfs mounted in a private mount
namespace (`unshare --mount --propagation private`, so as root): the host's mounts never see it.
The estimate and the line on their own: tests/test_trainer_storage.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import LAUNCH_TIMEOUT_S, torchrun_cmd, trainer_env

from trainer.catalog import MODELS
from trainer.checkpoint import TEST_HOOK_ENV, verify
from trainer.storage import checkpoint_bytes

pytestmark = pytest.mark.realpods  # root: a tmpfs in a mount namespace

TINY_SIZE = checkpoint_bytes(MODELS["tiny"], False, world_size=2, writer_threads=8)


def launch_cmd(*overrides: str) -> list[str]:
    cmd = torchrun_cmd(["checkpoint.export_dir=", "checkpoint.keep_last=1", *overrides])
    cmd[cmd.index("torch.distributed.run")] = "trainer.launch"
    return cmd


def on_tmpfs(tmp_path: Path, size: int, runs: list[tuple[list[str], dict[str, str]]]) -> list[tuple[int, str]]:
    """Run each command in turn with a tmpfs of `size` bytes at tmp_path/ckpt, in a private mount
    namespace; copies the tmpfs's content to tmp_path/after and its free bytes after each run to
    tmp_path/free-<i>. Returns (exit status, output) of each run."""
    ckpt, after = tmp_path / "ckpt", tmp_path / "after"
    ckpt.mkdir()
    after.mkdir()
    lines = [f"mount -t tmpfs -o size={size} fsdp-test-ckpt {ckpt} || exit 99"]
    for i, (cmd, env) in enumerate(runs):
        assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        lines += [
            f"env {assigned} {shlex.join(cmd)} > {tmp_path}/log-{i} 2>&1; echo $? > {tmp_path}/rc-{i}",
            f"df -B1 --output=avail {ckpt} | tail -1 > {tmp_path}/free-{i}",
        ]
    lines.append(f"cp -a {ckpt}/. {after}/")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)],
        cwd=REPO_ROOT,
        env=trainer_env(),
        start_new_session=True,
    )
    try:
        proc.wait(timeout=LAUNCH_TIMEOUT_S * len(runs))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"the runs on the tmpfs did not finish in {LAUNCH_TIMEOUT_S * len(runs)}s") from None
    assert proc.returncode == 0, f"the tmpfs could not be mounted (exit {proc.returncode}); these tests run as root"
    return [(int((tmp_path / f"rc-{i}").read_text()), (tmp_path / f"log-{i}").read_text()) for i in range(len(runs))]


def on_disk(path: Path) -> int:
    return sum(f.lstat().st_blocks * 512 for f in path.iterdir())


def test_a_volume_smaller_than_two_checkpoints_is_refused_at_start_in_one_line(tmp_path):
    size = int(TINY_SIZE * 1.5)
    overrides = [f"checkpoint.dir={tmp_path / 'ckpt' / 'run'}", f"metrics.output_dir={tmp_path / 'metrics'}"]
    [(rc, log)] = on_tmpfs(tmp_path, size, [(launch_cmd(*overrides, "checkpoint.interval_steps=1"), {})])
    assert rc == 2, log[-4000:]
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log[-4000:]
    assert errors[0].startswith(f"error: command line: checkpoint.dir: {tmp_path / 'ckpt' / 'run'}: 2 checkpoints of ")
    assert "(keep_last 1, plus the one being written) need " in errors[0]
    assert "free; free space, use a larger volume or set training.bf16_optimizer_state: true" in errors[0]
    assert "Traceback" not in log
    # Refused before the model was built on the device: no step, no metrics, nothing on the volume.
    assert not [line for line in log.splitlines() if line.startswith(("model:", "step "))], log[-4000:]
    assert not (tmp_path / "metrics" / "metrics.jsonl").exists()
    assert list((tmp_path / "after").iterdir()) == []


def test_keep_last_1_rotates_on_a_volume_that_holds_two_checkpoints_and_resumes_there(tmp_path):
    size = int(TINY_SIZE * 2.5)
    hook = tmp_path / "hook"
    hook.mkdir()
    common = [f"checkpoint.dir={tmp_path / 'ckpt'}", f"metrics.output_dir={tmp_path / 'metrics'}"]
    common.append("checkpoint.interval_steps=1")
    (rc1, log1), (rc2, log2) = on_tmpfs(
        tmp_path,
        size,
        [
            (launch_cmd(*common, "training.max_steps=12"), {TEST_HOOK_ENV: str(hook)}),
            (launch_cmd(*common, "training.max_steps=16"), {}),
        ],
    )
    assert rc1 == 0, log1[-4000:]
    # A checkpoint was written after every step, each beside the previous one, which went only then.
    events = [json.loads(line) for line in (hook / "events-rank0.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "complete"] == list(range(1, 13))
    assert [e["path"] for e in events if e["event"] == "removed"] == [f"step-{s:08d}" for s in range(1, 12)]
    assert "failed" not in log1 and "error:" not in log1

    # The volume really holds two checkpoints and not three, and the estimate covers the real size.
    real = on_disk(tmp_path / "after" / "step-00000016")
    assert 2 * real <= size < 3 * real, (real, size)
    assert real <= TINY_SIZE <= 1.1 * real, (real, TINY_SIZE)
    # The resumed run found less free space than two checkpoints need: the one there counted as room.
    free_after_first = int((tmp_path / "free-0").read_text())
    assert free_after_first < 2 * TINY_SIZE
    assert rc2 == 0, log2[-4000:]
    assert f"resumed from {tmp_path / 'ckpt' / 'step-00000012'} at step 12" in log2
    assert sorted(p.name for p in (tmp_path / "after").iterdir()) == ["step-00000016"]
    assert verify(str(tmp_path / "after" / "step-00000016")) is None
