"""The trainer when its checkpoint volume fills up during a checkpoint: one line, and the previous
checkpoint kept whole. trainer/configs/tiny.yaml on 2 CPU ranks through `python -m trainer.launch`
with checkpoint.dir on a small tmpfs, mounted in a private mount namespace (so as root) that another
writer fills while a step's checkpoint is held. The trainer's other faults: tests/test_trainer_robustness.py.
"""

from __future__ import annotations

import pytest
from trainer_support import output_overrides, run_launcher, trainer_env

from trainer.checkpoint import TEST_HOOK_ENV, verify

pytestmark = pytest.mark.realpods  # root: a tmpfs in a mount namespace


def test_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path):
    # A checkpoint of the tiny model takes about 2 MB; the 8 MB volume passes the start check for
    # keep_last 2 (trainer/storage.py). Another writer then fills it while step 5 is being written
    # (held by the test hook after its shards), leaving 64 kB for step 5's last small files: step 10
    # finds no room.
    ckpt, copy, hook = tmp_path / "ckpt", tmp_path / "after", tmp_path / "hook"
    for folder in (ckpt, copy, hook):
        folder.mkdir()
    (hook / "hold-step-5").touch()
    script = (
        'mount -t tmpfs -o size=8m fsdp-test-full "$CKPT" || exit 99; '
        '(while [ ! -e "$HOOK/held-step-5-rank-0" ] || [ ! -e "$HOOK/held-step-5-rank-1" ]; do sleep 0.05; done; '
        'head -c $(( $(df -B1 --output=avail "$CKPT" | tail -1) - 65536 )) /dev/zero > "$CKPT/filler"; '
        'rm "$HOOK/hold-step-5") & '
        '"$@"; rc=$?; rm "$CKPT/filler"; cp -a "$CKPT/." "$COPY/"; exit $rc'
    )
    env = trainer_env(CKPT=str(ckpt), COPY=str(copy), HOOK=str(hook), **{TEST_HOOK_ENV: str(hook)})
    log = run_launcher(
        [*output_overrides(tmp_path), "training.max_steps=10", "checkpoint.interval_steps=5"],
        expect_rc=202,
        prefix=["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"],
        env=env,
    )
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log[-4000:]
    assert "step-00000010 failed: No space left on device" in errors[0]
    assert f"{ckpt / 'step-00000005'} is intact" in errors[0]
    assert "Traceback" not in log
    # Inside the namespace: step 5 whole and loadable, nothing half-written left taking space.
    assert sorted(p.name for p in copy.iterdir()) == ["step-00000005"]
    assert verify(str(copy / "step-00000005")) is None
