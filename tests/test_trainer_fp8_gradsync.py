"""Gradient accumulation with one gradient reduction per optimizer step (parallelism.grad_sync=last)
gives the same training as a reduce-scatter per micro-batch (every): a real 2-rank torchrun run each."""

from __future__ import annotations

import pytest
from trainer_support import losses_by_step, output_overrides, read_metrics, run

ACCUM = ["training.max_steps=6", "training.grad_accum_steps=3", "training.batch_size_per_gpu=2", "checkpoint.dir="]


@pytest.mark.slow
def test_deferred_gradient_sync_matches_a_sync_per_micro_batch(tmp_path):
    curves = {}
    for mode in ("last", "every"):
        out = tmp_path / mode
        run([*output_overrides(out), *ACCUM, f"parallelism.grad_sync={mode}"])
        records = read_metrics(out)
        curves[mode] = (losses_by_step(records), {r["step"]: r["grad_norm"] for r in records})
    (loss_last, norm_last), (loss_every, norm_every) = curves["last"], curves["every"]
    assert sorted(loss_last) == list(range(1, 7)) == sorted(loss_every)
    # fp32 on CPU: the two orders of summation differ only by rounding.
    for step in loss_last:
        assert loss_last[step] == pytest.approx(loss_every[step], rel=1e-5, abs=1e-6)
        assert norm_last[step] == pytest.approx(norm_every[step], rel=1e-4)
    assert loss_last[6] < loss_last[1]
