"""What a run spends besides its training steps (generators/plan/overheads.py): each term, the plan's
columns, hours and cost that include them, the download and staging once per cluster, and the
checkpoint rates read from the benchmark's results file or, while it is missing, the measured
synchronous save."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
from matrix_support import HEADER
from support import REPO_ROOT

from generators.core.errors import InputError
from generators.matrix import expand, load
from generators.plan import overheads as oh
from generators.plan import plan_runs
from generators.plan.cost import load_prices
from generators.plan.estimate import estimate_matrix
from generators.plan.table import PLAN_HEADER, plan_markdown, plan_rows
from trainer.catalog import MODELS
from trainer.config import from_dict

GB = 1e9
P7 = MODELS["llama2-7b"].num_params


def cfg_7b(**checkpoint):
    return from_dict(
        {
            "model": {"name": "llama2-7b", "path": "meta-llama/Llama-2-7b-hf"},
            "data": {"format": "samsum", "path": "/shared/data/samsum/train.jsonl", "seq_len": 4096},
            "training": {"batch_size_per_gpu": 2},
            "checkpoint": {"dir": "/shared/checkpoints/x", "interval_steps": 100, **checkpoint},
        }
    )


def with_async(cfg, mode: str):
    """The config with checkpoint.async_mode set (a field the trainer's checkpoint settings carry)."""
    fields = {f.name: getattr(cfg.checkpoint, f.name) for f in dataclasses.fields(cfg.checkpoint)}
    return dataclasses.replace(cfg, checkpoint=types.SimpleNamespace(**{**fields, "async_mode": mode}))


RATES = oh.CheckpointRates(
    sync_gb_s={1: 0.4, 8: 0.5}, write_gb_s={8: 1.0}, load_gb_s=2.0, stage_gb_s=20.0, source="t", measured=True
)


def test_each_term_is_its_named_constants_and_the_run():
    cfg = with_async(cfg_7b(export_dir="/shared/exports/x"), "disabled")
    cfg = dataclasses.replace(cfg, checkpoint=types.SimpleNamespace(**{**vars(cfg.checkpoint), "writer_threads": 8}))
    o = oh.overheads(
        MODELS["llama2-7b"],
        cfg,
        world=8,
        shard=8,
        step_s=2.0,
        steps=1000,
        shared_storage_gib=2048,
        downloads_model=True,
        stages_data=True,
        dataset_tokens=3_000_000,
        rates=RATES,
    )
    volume = 2.0 * 250e6 / GB  # 2 TiB at 250 MB/s per TiB
    assert oh.shared_volume_gb_s(2048) == pytest.approx(volume)
    assert o.start_s == pytest.approx(oh.POD_START_S + oh.IMAGE_GB / oh.IMAGE_PULL_GB_S)
    weights = 2 * P7 / GB
    # Each rank reads 1/8 of the weights at 2 GB/s; the volume serves all of them at 0.5 GB/s.
    assert o.model_load_s == pytest.approx(max(weights / 8 / 2.0, weights / volume) + weights / oh.HF_DOWNLOAD_GB_S)
    assert o.staging_s == pytest.approx(oh.STAGING_JOB_S + 3e6 * oh.BYTES_PER_TOKEN / GB / oh.HF_DOWNLOAD_GB_S)
    # fp32 parameters and both moments: 12 bytes a parameter, 1/8 per rank, the volume the bound.
    write = max(12 * P7 / GB / 8 / 0.5, 12 * P7 / GB / volume)
    assert o.saves == 9  # steps 100 .. 900; the save at step 1000 is the final one
    assert o.save_blocking_s == pytest.approx(write)  # synchronous: training waits for the files
    # The export: one writer, the one-thread rate.
    assert o.final_s == pytest.approx(write + max(weights / 0.4, weights / volume))
    assert o.total_s == pytest.approx(o.start_s + o.model_load_s + o.staging_s + 9 * write + o.final_s)


def test_an_asynchronous_save_blocks_for_the_copy_and_for_a_write_still_in_flight():
    arch = MODELS["llama2-7b"]
    common = dict(world=1, shard=1, steps=1001, shared_storage_gib=2048, downloads_model=False, stages_data=False)
    state = 12 * P7 / GB
    volume = 2.0 * 250e6 / GB
    cfg = with_async(cfg_7b(), "async_with_pinned_mem")
    cfg = dataclasses.replace(cfg, checkpoint=types.SimpleNamespace(**{**vars(cfg.checkpoint), "writer_threads": 4}))
    # 4 threads: the background write was measured with 8 only, so at its fewest, 8 (1.0 GB/s).
    write = max(state / 1.0, state / volume)
    fast = oh.overheads(arch, cfg, step_s=100.0, dataset_tokens=None, rates=RATES, **common)
    assert fast.save_blocking_s == pytest.approx(state / 20.0)  # 100 steps of 100 s outlast the write
    assert fast.final_s == pytest.approx(state / 20.0 + write)
    slow = oh.overheads(arch, cfg, step_s=0.5, dataset_tokens=None, rates=RATES, **common)
    assert slow.save_blocking_s == pytest.approx(state / 20.0 + write - 100 * 0.5)
    # Without a measured copy an asynchronous save counts as the synchronous one (1 thread: 0.4 GB/s).
    unmeasured = dataclasses.replace(RATES, stage_gb_s=None)
    sync_like = oh.overheads(arch, cfg, step_s=100.0, dataset_tokens=None, rates=unmeasured, **common)
    assert sync_like.save_blocking_s == pytest.approx(max(state / 0.4, state / volume))
    assert any("count as synchronous" in n for n in oh.notes(unmeasured, async_runs=True))


def test_no_checkpoint_dir_and_no_weights_spend_nothing_on_them():
    cfg = from_dict({"model": {"name": "tiny"}, "data": {"format": "synthetic", "seq_len": 64}})
    o = oh.overheads(
        MODELS["tiny"],
        cfg,
        world=1,
        shard=1,
        step_s=1.0,
        steps=10,
        shared_storage_gib=1200,
        downloads_model=True,
        stages_data=True,
        dataset_tokens=640,
        rates=RATES,
    )
    assert (o.model_load_s, o.staging_s, o.saves_s, o.final_s) == (0.0, 0.0, 0.0, 0.0)
    assert o.total_s == o.start_s > 0


def seed_estimate():
    matrix = load(str(REPO_ROOT / "matrix.yaml"))
    return estimate_matrix(matrix, plan_runs(matrix, expand(matrix), reject_unfit=False), load_prices())


def test_the_plan_shows_every_term_as_a_column_and_its_hours_and_cost_include_them():
    est = seed_estimate()
    for column in ("start, min", "model load, min", "data staging, min", "saves, min", "final save and export, min"):
        assert column in PLAN_HEADER
    text = plan_markdown(est)
    assert "Hours count the training steps, the start, the model load, the data staging" in text
    for run, row in zip(est.runs, plan_rows(est.runs), strict=True):
        f = run.figures
        o = f.overheads
        assert f.hours == pytest.approx(f.steps * f.speed.step_s / 3600 + o.total_s / 3600)
        assert f.hours > f.training_hours
        assert f.cost_usd == pytest.approx(
            f.hours * f.nodes * 55.04 if "-p5-" in run.name else f.hours * f.nodes * 27.44705
        )
        cells = dict(zip(PLAN_HEADER, row, strict=True))
        assert float(cells["start, min"]) == pytest.approx(o.start_s / 60, abs=0.05)
        assert float(cells["final save and export, min"]) == pytest.approx(o.final_s / 60, abs=0.05)
        assert float(cells["hours"].replace(",", "")) == pytest.approx(f.hours, abs=0.01)
    # 70B: the final save of 12 x 69 billion bytes at the 7,200 GiB volume's 1,758 MB/s, 7.9 minutes.
    seventy = next(r for r in est.runs if r.name.startswith("llama2-70b-p5-n4-"))
    assert seventy.figures.overheads.final_s / 60 == pytest.approx(7.85, abs=0.1)


def test_the_weights_download_and_the_data_staging_count_once_per_cluster():
    est = seed_estimate()
    by_cluster: dict[tuple[str, str], list] = {}
    for r in est.runs:
        by_cluster.setdefault((r.cluster, r.model), []).append(r.figures.overheads)
    weights = 2 * P7 / GB
    for cluster in ("fsdp-p4de", "fsdp-p5"):
        first, *rest = by_cluster[(cluster, "llama2-7b")]
        assert first.model_load_s - rest[0].model_load_s >= weights / oh.HF_DOWNLOAD_GB_S
        assert first.staging_s >= oh.STAGING_JOB_S and all(o.staging_s == 0 for o in rest)
    staged = [r.name for r in est.runs if r.figures.overheads.staging_s > 0]
    assert len(staged) == 2  # one dataset, two clusters


def test_the_rates_are_the_measured_synchronous_save_until_the_results_file_exists(tmp_path):
    assert not (REPO_ROOT / oh.CHECKPOINT_RESULTS).exists() or oh.read_checkpoint_rates().measured
    rates = oh.read_checkpoint_rates(tmp_path / "absent.jsonl")
    assert rates is oh.FALLBACK_RATES and not rates.measured
    assert rates.sync_rate(4) == rates.load_gb_s == pytest.approx(56 / 117.5) and rates.stage_gb_s is None
    note = " ".join(oh.notes(rates, async_runs=False))
    assert "81.6 s and 117.5 s" in note and f"{oh.CHECKPOINT_RESULTS} not recorded yet" in note


def bench_record(kind: str, **figures) -> dict:
    """A record as benchmarks/checkpoint_bench.py writes it (with fields the planner does not read)."""
    return {
        "name": "bf16-moments",
        "kind": kind,
        "model": "llama2-7b",
        "world_size": 1,
        "dir": "/dev/shm/ckpt",
        **figures,
    }


def test_the_rates_come_from_the_results_file_once_it_exists(tmp_path):
    path = tmp_path / "h200x1-checkpoint.jsonl"
    state = 53.9e9
    records = [
        bench_record("async-stage-only", save=1, blocking_s=9.0, state_bytes=80.9e9),
        bench_record(
            "async-save", save=1, writer_threads=8, blocking_s=20.0, write_s=60.0, bytes=54e9, state_bytes=state
        ),
        bench_record(
            "async-save", save=2, writer_threads=8, blocking_s=2.0, write_s=50.0, bytes=54e9, state_bytes=state
        ),
        bench_record("load", load_s=30.0, bytes=54e9, read_gb_per_s=1.8),
        bench_record("sync-save", writer_threads=1, blocking_s=108.0, write_s=107.0, bytes=54e9),
        bench_record("sync-save", writer_threads=8, blocking_s=36.0, write_s=35.0, bytes=54e9),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rates = oh.read_checkpoint_rates(path)
    assert rates.measured
    assert rates.sync_gb_s == {1: pytest.approx(0.5), 8: pytest.approx(1.5)}
    assert rates.write_gb_s == {8: pytest.approx((54 / 60 + 54 / 50) / 2)}  # the median of two
    assert rates.load_gb_s == pytest.approx(1.8)
    # The copy: the median of 80.9/9, 53.9/20 and 53.9/2 GB/s.
    assert rates.stage_gb_s == pytest.approx(80.9 / 9.0)
    # A run's writer_threads picks the most threads measured, not above its own.
    assert rates.sync_rate(4) == pytest.approx(0.5) and rates.sync_rate(16) == pytest.approx(1.5)
    note = " ".join(oh.notes(rates, async_runs=True))
    assert str(path) in note and "not recorded yet" not in note and "count as synchronous" not in note


@pytest.mark.parametrize(
    "line,message",
    [
        ("{not json", "not JSON"),
        ('{"kind": "async-save-x", "blocking_s": 3}', "kind: unknown record kind 'async-save-x'"),
        ('{"kind": "sync-save", "writer_threads": 1, "blocking_s": 3}', "bytes: must be a positive number, got None"),
        ('{"kind": "load", "bytes": 5e10, "load_s": -1}', "load_s: must be a positive number"),
        ('{"kind": "async-save", "writer_threads": 8, "blocking_s": 2, "bytes": 5e10}', "state_bytes: must be"),
    ],
)
def test_a_bad_record_in_the_results_file_names_its_line_and_key(tmp_path, line, message):
    path = tmp_path / "h200x1-checkpoint.jsonl"
    first = json.dumps(bench_record("sync-save", writer_threads=1, blocking_s=80.0, bytes=5e10))
    path.write_text(first + "\n" + line + "\n")
    with pytest.raises(InputError) as err:
        oh.read_checkpoint_rates(path)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value) and "; fix: " in str(err.value)


def test_a_results_file_without_a_save_is_bad_input(tmp_path):
    path = tmp_path / "h200x1-checkpoint.jsonl"
    path.write_text(json.dumps(bench_record("load", load_s=30.0, bytes=54e9)) + "\n")
    with pytest.raises(InputError, match="holds no save with its write"):
        oh.read_checkpoint_rates(path)


def test_a_run_with_synthetic_data_and_max_steps_counts_saves_from_its_steps(tmp_path):
    matrix_file = tmp_path / "m.yaml"
    matrix_file.write_text(
        HEADER + "defaults:\n  cluster: fsdp-p5\n  model: llama2-7b\n  trainer:\n"
        "    data: {format: synthetic, num_synthetic_samples: 100000}\n"
        "    training: {max_steps: 1000}\n    checkpoint: {interval_steps: 200}\n"
        "include:\n  - {nodes: 1}\n"
    )
    matrix = load(str(matrix_file))
    [run] = estimate_matrix(matrix, plan_runs(matrix, expand(matrix), reject_unfit=False), load_prices()).runs
    o = run.figures.overheads
    assert o.saves == 4 and o.staging_s == 0.0
    assert o.saves_s == pytest.approx(4 * o.save_blocking_s) and o.save_blocking_s > 0
    assert run.figures.hours == pytest.approx((1000 * run.figures.speed.step_s + o.total_s) / 3600)


def test_the_results_file_the_planner_reads_is_under_benchmarks_results():
    assert Path(oh.CHECKPOINT_RESULTS).parent == Path("benchmarks/results")
