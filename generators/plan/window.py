"""Runs that cannot finish inside their Capacity Block: a warning, not a refusal.

A cluster with `capacity_block_end` stops every run before the block ends (trainer/capacity_block.py:
at the end less AWS's 30-minute termination lead, the run's checkpoint time and a margin, the run
checkpoints and exits 1). A run whose predicted hours (the plan's: its steps and overheads,
generators/plan/estimate.py) exceed the time from the matrix's check (Matrix.checked_at) to that stop
will be stopped before it is done. The generator says so, one line per run on stderr, and writes the
overlays anyway:

- nothing is lost: the stop writes a checkpoint, and bumping the run's `retry` once the next block is
  set resumes it there, so a run longer than one block is a plan a user may make on purpose;
- the figure is a prediction (uncalibrated outside one H200) and the window is an upper bound (a
  run starts when it is merged, synced and admitted, later than the check), so a refusal would be
  neither exact nor safe to rely on; a warning that names both figures lets the user judge.

Nothing here reaches a generated file: the window depends on the clock, and generated files must not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from generators.matrix.load import Matrix
from generators.matrix.schema import Run
from generators.plan import Plan, plan_runs
from generators.plan.estimate import Context, dataset_tokens, figures, unresolved_config
from generators.plan.overheads import read_checkpoint_rates
from trainer.capacity_block import parse_end, stop_time
from trainer.catalog import INSTANCE_TYPES, MODELS


def overrun_warnings(matrix: Matrix, runs: Sequence[Run]) -> list[str]:
    """block_overruns of the matrix's runs (planned here, only where a cluster has a block end)."""
    if not any(c.capacity_block_end for c in matrix.clusters.values()):
        return []
    return block_overruns(matrix, plan_runs(matrix, runs, reject_unfit=False))


def block_overruns(matrix: Matrix, plans: Sequence[Plan]) -> list[str]:
    """One warning (file:line: key: message; fix) per run predicted to outlast its cluster's block."""
    blocks = {name: c for name, c in matrix.clusters.items() if c.capacity_block_end}
    mine = [p for p in plans if p.cluster in blocks]
    if not mine:
        return []
    rates = read_checkpoint_rates()
    now = matrix.checked_at.timestamp()
    out: list[str] = []
    models_seen: set[tuple[str, str]] = set()
    data_seen: set[tuple[str, str]] = set()
    for p in mine:
        cluster = blocks[p.cluster]
        end = parse_end(cluster.capacity_block_end)
        assert end is not None  # load() checked it
        tokens, _ = dataset_tokens(p.trainer)
        model_key, data_key = (p.cluster, p.model), (p.cluster, p.trainer.data.path)
        context = Context(
            shared_storage_gib=cluster.shared_storage_gib,
            downloads_model=model_key not in models_seen,
            stages_data=data_key not in data_seen,
            rates=rates,
        )
        models_seen.add(model_key)
        data_seen.add(data_key)
        f = figures(
            MODELS[p.model],
            unresolved_config(p.trainer, p.run),
            INSTANCE_TYPES[p.instance_type],
            p.nodes,
            p.gpus_per_node,
            tokens,
            None,
            context,
        )
        left_h = (stop_time(end, f.overheads.final_s) - now) / 3600
        if math.isnan(f.hours) or f.hours <= left_h:
            continue
        line = cluster.lines.get("capacity_block_end", 0)
        out.append(
            f"{matrix.file}:{line}: clusters.{cluster.name}.capacity_block_end: run {p.name} needs about "
            f"{f.hours:,.1f} hours (the plan's prediction) but the block leaves {max(left_h, 0.0):,.1f} "
            f"before the runs stop at {cluster.capacity_block_end} less 30 minutes and the checkpoint; it "
            "will checkpoint and stop unfinished; fix: resume it in the next block (set its end here and "
            "bump the run's retry), or shorten it (trainer.training.max_steps)"
        )
    return out
