"""A scaling series is one configuration (model, sequence length, batch, precision, strategy,
checkpointing) across world sizes: a results file with two models under one benchmark name reports
each model on its own, with the efficiencies computed by hand, and every measured run has the speed
model's prediction beside it."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_support import bench_record, run_info, write_jsonl, write_run

from generators.report import main
from generators.results import render as report
from generators.results.measurements import load, summarise


def config(model: str, batch: int = 2, checkpointing: str = "none") -> dict:
    """A benchmarks/common.py config as train_bench.py records it."""
    return {
        "model": model,
        "seq_len": 4096,
        "batch_size_per_gpu": batch,
        "grad_accum_steps": 1,
        "parallelism.sharding_strategy": "FULL_SHARD",
        "parallelism.precision": "bf16",
        "parallelism.activation_checkpointing": checkpointing,
        "parallelism.compile": True,
        "parallelism.selective_ac_every": 2,
        "training.bf16_optimizer_state": False,
        "training.loss_impl": "chunked",
    }


@pytest.fixture
def two_models(tmp_path: Path) -> Path:
    """One benchmark name, two models, 1 and 2 GPUs each (as one suite run over models writes it)."""
    return write_jsonl(
        tmp_path / "h200x2.jsonl",
        [
            bench_record("default", 1, 11000.0, config=config("llama2-7b")),
            bench_record("default", 2, 11110.0, config=config("llama2-7b")),
            bench_record("default", 1, 8000.0, config=config("llama3.1-8b", checkpointing="full")),
            bench_record("default", 2, 7600.0, config=config("llama3.1-8b", checkpointing="full")),
        ],
    )


def test_each_model_is_its_own_series_with_hand_computed_efficiencies(two_models):
    points = summarise(load([str(two_models)], 3))
    by = {(p.series, p.world_size): p for p in points}
    seven = "default (model llama2-7b, checkpointing none)"
    eight = "default (model llama3.1-8b, checkpointing full)"
    assert set(by) == {(seven, 1), (seven, 2), (eight, 1), (eight, 2)}
    assert by[(seven, 2)].efficiency == pytest.approx(11110.0 / 11000.0)  # 101%
    assert by[(eight, 2)].efficiency == pytest.approx(7600.0 / 8000.0)  # 95%
    assert by[(seven, 2)].tokens_per_s == pytest.approx(2 * 11110.0)
    # Nothing is left of the name alone, which would have mixed the models into one made-up series.
    assert "default" not in {p.series for p in points}


def test_a_name_with_one_configuration_keeps_its_name(tmp_path):
    path = write_jsonl(
        tmp_path / "b.jsonl",
        [
            bench_record("default", 1, 11000.0, config=config("llama2-7b")),
            bench_record("default", 2, 10900.0, config=config("llama2-7b")),
        ],
    )
    assert {p.series for p in summarise(load([str(path)], 3))} == {"default"}


def test_trainer_runs_of_two_batch_sizes_are_two_series(tmp_path):
    for i, (world, batch, figure) in enumerate([(1, 2, 10.0), (2, 2, 9.0), (1, 4, 20.0), (2, 4, 19.0)]):
        info = run_info(world)
        info["config"]["training"] = {"batch_size_per_gpu": batch}
        info["config"]["data"] = {"seq_len": 64}
        write_run(tmp_path / f"r{i}", world, [figure] * 6, info=info)
    points = summarise(load([str(tmp_path / f"r{i}") for i in range(4)], 3))
    assert sorted({p.series for p in points}) == ["tiny FULL_SHARD (batch 2)", "tiny FULL_SHARD (batch 4)"]
    assert [p.efficiency for p in points if p.world_size == 2] == pytest.approx([0.9, 0.95])


def test_every_measured_h200_run_has_the_predicted_tokens_per_second(two_models):
    points = summarise(load([str(two_models)], 3))
    for p in points:
        assert p.predicted_tokens_per_s_per_gpu is not None and p.predicted_tokens_per_s_per_gpu > 1000
    table = report.markdown_table(points)
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[-1] == "predicted tokens/s per GPU (error)"
    first = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    predicted = points[0].predicted_tokens_per_s_per_gpu
    assert first[-1] == f"{predicted:,.0f} ({predicted / points[0].tokens_per_s_per_gpu - 1:+.0%})"


def test_a_cpu_run_has_no_prediction(tmp_path):
    write_run(tmp_path / "cpu", 2, [5.0] * 6)
    [p] = summarise(load([str(tmp_path / "cpu")], 3))
    assert p.predicted_tokens_per_s_per_gpu is None
    assert report.markdown_table([p]).splitlines()[2].rstrip(" |").endswith("-")


def test_the_report_command_prints_the_split_series(two_models, cli):
    result = cli(main, [str(two_models)])
    assert result.exit_code == 0, result.output
    assert "default (model llama2-7b, checkpointing none)" in result.stdout
    assert "101.0%" in result.stdout and "95.0%" in result.stdout
