"""Every sharding strategy, checkpointing mode and packing setting trains, on CPU through torchrun.

The four strategies run the same short job with the same global batch of 8 rows, split differently
(batch per rank x ranks x accumulation), with different checkpointing modes and both loss paths.
Initialisation does not depend on the sharding and the loss is normalised by the global number of
trained tokens, so all four must follow the same loss curve up to float rounding: a strategy that
dropped a gradient shard, double-counted a micro-batch or mis-scaled the loss would stand out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_support import losses_by_step, output_overrides, read_metrics, run

# Every test trains through real torchrun processes.
pytestmark = pytest.mark.slow

STEPS = 6
COMMON = [
    f"training.max_steps={STEPS}",
    "training.lr_schedule=constant",
    "training.warmup_steps=0",
    "checkpoint.interval_steps=0",
]
# (name, ranks, overrides): 8 rows per optimizer step in every case.
STRATEGIES = [
    ("full_shard", 2, ["parallelism.sharding_strategy=FULL_SHARD", "parallelism.activation_checkpointing=full"]),
    (
        "shard_grad_op",
        2,
        [
            "parallelism.sharding_strategy=SHARD_GRAD_OP",
            "parallelism.activation_checkpointing=selective",
            "training.batch_size_per_gpu=2",
            "training.grad_accum_steps=2",
            "parallelism.reshard_last_layer=true",
            "parallelism.prefetch=false",
        ],
    ),
    # 4 ranks in 2 shard groups of 2: a real 2-D (replicate, shard) mesh.
    (
        "hybrid_shard",
        4,
        [
            "parallelism.sharding_strategy=HYBRID_SHARD",
            "parallelism.shard_group_size=2",
            "parallelism.activation_checkpointing=none",
            "training.batch_size_per_gpu=1",
            "training.grad_accum_steps=2",
        ],
    ),
    (
        "no_shard",
        2,
        [
            "parallelism.sharding_strategy=NO_SHARD",
            "parallelism.activation_checkpointing=none",
            "training.loss_impl=full",
        ],
    ),
]


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    runs = {}
    for name, nproc, overrides in STRATEGIES:
        out = tmp_path_factory.mktemp(name)
        run([*output_overrides(out), *COMMON, *overrides], nproc=nproc)
        runs[name] = (out, read_metrics(out))
    return runs


def test_each_strategy_trains_and_saves(strategy_runs):
    for name, (out, records) in strategy_runs.items():
        losses = losses_by_step(records)
        assert sorted(losses) == list(range(1, STEPS + 1)), name
        assert losses[STEPS] < losses[1] - 0.5, (name, losses)
        assert (out / "ckpt" / f"step-{STEPS:08d}" / "COMPLETE").is_file(), name


def test_strategies_follow_the_same_loss_curve(strategy_runs):
    reference = losses_by_step(strategy_runs["full_shard"][1])
    for name, (_, records) in strategy_runs.items():
        losses = losses_by_step(records)
        for step in range(1, STEPS + 1):
            assert losses[step] == pytest.approx(reference[step], rel=1e-6, abs=0), (name, step)


def test_mesh_and_checkpointing_mode_recorded(strategy_runs):
    meshes = {
        name: json.loads((out / "metrics" / "run.json").read_text())["mesh"] for name, (out, _) in strategy_runs.items()
    }
    assert meshes == {
        "full_shard": {"shard": 2},
        "shard_grad_op": {"shard": 2},
        "hybrid_shard": {"replicate": 2, "shard": 2},
        "no_shard": {"replicate": 2, "shard": 1},
    }


def test_alpaca_without_packing_in_bf16_trains(tmp_path):
    # One example per row: mostly padding, which the metrics report; bf16 compute and bf16 Adam moments.
    run(
        [
            *output_overrides(tmp_path),
            "data.path=tests/data/alpaca_tiny.jsonl",
            "data.format=alpaca",
            "data.packing=false",
            "training.max_steps=8",
            "training.warmup_steps=2",
            "parallelism.precision=bf16",
            "training.bf16_optimizer_state=true",
            "parallelism.activation_checkpointing=selective",
            "checkpoint.interval_steps=0",
        ]
    )
    records = read_metrics(tmp_path)
    losses = losses_by_step(records)
    assert losses[8] < losses[1] - 1.0, losses
    assert all(r["padding_fraction"] > 0.4 for r in records)
    run_info = json.loads((tmp_path / "metrics" / "run.json").read_text())
    assert run_info["dataset"]["rows"] == run_info["dataset"]["examples"] == 320
