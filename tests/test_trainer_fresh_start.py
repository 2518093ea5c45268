"""`checkpoint.resume=false` in a checkpoint.dir that already holds checkpoints of an earlier run: the
new run's checkpoints would be numbered below the old ones, and keep_last rotation (oldest step first)
would delete each of them as soon as it completed, so the run would train to its end and keep nothing.
It is refused at start instead, in one line that names the folder and the fixes, and nothing there is
touched. The real trainer under torchrun, twice in one folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import LAUNCH_TIMEOUT_S, output_overrides, run, torchrun_cmd, trainer_env

pytestmark = pytest.mark.slow


def steps_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("step-"))


def test_a_fresh_start_among_an_earlier_runs_checkpoints_is_refused_and_keeps_them(tmp_path: Path) -> None:
    base = [*output_overrides(tmp_path), "checkpoint.interval_steps=2", "checkpoint.keep_last=2"]
    run([*base, "training.max_steps=8"])
    before = {name: (tmp_path / "ckpt" / name / "COMPLETE").stat().st_mtime_ns for name in steps_in(tmp_path / "ckpt")}
    assert list(before) == ["step-00000006", "step-00000008"]
    # Through the launcher the generated jobs use, which passes the trainer's exit 2 on.
    cmd = torchrun_cmd([*base, "training.max_steps=4", "checkpoint.resume=false"])
    cmd[cmd.index("torch.distributed.run")] = "trainer.launch"
    done = subprocess.run(
        cmd, cwd=REPO_ROOT, env=trainer_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert "checkpoint.resume" in errors[0] and str(tmp_path / "ckpt") in errors[0], errors[0]
    assert "step-00000008" in errors[0] and "checkpoint.dir" in errors[0] and "fix" not in errors[0].split(":")[0]
    # Nothing was trained and nothing in the folder changed.
    assert {n: (tmp_path / "ckpt" / n / "COMPLETE").stat().st_mtime_ns for n in steps_in(tmp_path / "ckpt")} == before
    # Resuming there (the default) still works, from the newest.
    log = run([*base, "training.max_steps=10"])
    assert "resumed from" in log and "step-00000008" in log
