"""The scaling report's core: reading benchmark lines and trainer runs, series and efficiency, the
Markdown table and the SVG charts (well-formed, one polyline per series, deterministic bytes)."""

from __future__ import annotations

import json
import math
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from report_support import bench_record, run_info, step_record, write_jsonl, write_run

from generators.core.errors import InputError
from generators.results import render as report
from generators.results.measurements import load, load_benchmarks, load_run, summarise
from generators.results.svgchart import nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def scaling(tmp_path: Path) -> Path:
    """Two series over 1-8 GPUs and one measured at 1 GPU only, in an unsorted file."""
    return write_jsonl(
        tmp_path / "bench.jsonl",
        [
            bench_record("fsdp2", 4, 9000.0),
            bench_record("fsdp2", 1, 10000.0),
            bench_record("baseline", 1, 6000.0),
            bench_record("fsdp2", 2, 9500.0),
            bench_record("fsdp2", 8, 8800.0),
            bench_record("baseline", 8, 4800.0),
            bench_record("eager", 1, 7000.0),
        ],
    )


def by_key(points):
    return {(p.series, p.world_size): p for p in points}


def test_benchmark_records_become_measurements_named_by_file_and_line(scaling):
    ms = load_benchmarks(scaling, "bench.jsonl")
    assert [(m.series, m.world_size) for m in ms][:3] == [("fsdp2", 4), ("fsdp2", 1), ("baseline", 1)]
    assert ms[1].source == "bench.jsonl:2"
    assert ms[1].tokens_per_s_per_gpu == 10000.0
    assert ms[1].peak_mem_gib == 100.5
    assert ms[1].device == "NVIDIA H200"
    assert ms[1].command.startswith("torchrun --nproc_per_node=1 ")


def test_a_benchmark_without_peak_memory_has_none(tmp_path):
    record = bench_record("cpu", 1, 100.0)
    del record["peak_allocated_gib"], record["peak_reserved_gib"]
    [m] = load_benchmarks(write_jsonl(tmp_path / "b.jsonl", [record]), "b.jsonl")
    assert m.peak_mem_gib is None
    [p] = summarise([m])
    assert p.peak_mem_gib is None
    cells = [c.strip() for c in report.markdown_table([p]).splitlines()[2].split("|")[1:-1]]
    assert cells[7] == "-"


def test_series_sorted_by_name_points_by_world_size(scaling):
    points = summarise(load([str(scaling)], 3))
    assert [(p.series, p.world_size) for p in points] == [
        ("baseline", 1),
        ("baseline", 8),
        ("eager", 1),
        ("fsdp2", 1),
        ("fsdp2", 2),
        ("fsdp2", 4),
        ("fsdp2", 8),
    ]


def test_efficiency_is_per_gpu_throughput_over_the_smallest_world_size_of_the_series(scaling):
    points = by_key(summarise(load([str(scaling)], 3)))
    assert points[("fsdp2", 1)].efficiency == 1.0
    assert points[("fsdp2", 2)].efficiency == pytest.approx(0.95)
    assert points[("fsdp2", 4)].efficiency == pytest.approx(0.90)
    assert points[("fsdp2", 8)].efficiency == pytest.approx(0.88)
    assert points[("baseline", 8)].efficiency == pytest.approx(0.80)
    assert points[("eager", 1)].efficiency == 1.0
    assert points[("fsdp2", 8)].tokens_per_s == pytest.approx(8 * 8800.0)
    assert points[("fsdp2", 8)].mfu == pytest.approx(8800.0 * 4.6e-5)
    assert points[("fsdp2", 8)].step_time_s == pytest.approx(8192 / 8800.0)


def test_an_explicit_baseline_world_size_is_100_percent(tmp_path):
    path = write_jsonl(
        tmp_path / "b.jsonl", [bench_record("s", n, t) for n, t in ((1, 1000.0), (2, 800.0), (4, 760.0))]
    )
    points = by_key(summarise(load([str(path)], 3), baseline_world_size=2))
    assert points[("s", 2)].efficiency == 1.0
    assert points[("s", 4)].efficiency == pytest.approx(0.95)
    assert points[("s", 1)].efficiency == pytest.approx(1.25)
    assert {p.baseline_world_size for p in points.values()} == {2}


def test_a_baseline_world_size_missing_from_a_series_is_bad_input(scaling):
    with pytest.raises(InputError) as err:
        summarise(load([str(scaling)], 3), baseline_world_size=2)
    assert err.value.key == "--baseline-world-size"
    assert "'baseline' has no measurement at 2 GPUs (it has 1, 8)" in str(err.value)


def test_repeated_measurements_of_a_point_are_combined_by_the_median(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [bench_record("s", 1, 100.0), bench_record("s", 2, 90.0)])
    b = write_jsonl(tmp_path / "b.jsonl", [bench_record("s", 1, 300.0), bench_record("s", 1, 200.0)])
    points = by_key(summarise(load([str(a), str(b)], 3)))
    one = points[("s", 1)]
    assert one.tokens_per_s_per_gpu == 200.0
    assert [m.source for m in one.measurements] == [f"{a}:1", f"{b}:1", f"{b}:2"]
    assert points[("s", 2)].efficiency == pytest.approx(0.45)


def test_figures_do_not_depend_on_input_order(scaling):
    measurements = load([str(scaling)], 3)
    shuffled = list(measurements)
    random.Random(7).shuffle(shuffled)
    assert shuffled != measurements
    strip = lambda points: [(p.series, p.world_size, p.efficiency, p.tokens_per_s) for p in points]  # noqa: E731
    assert strip(summarise(shuffled)) == strip(summarise(measurements))
    assert (
        report.render(summarise(shuffled), None)["scaling.svg"]
        == report.render(summarise(measurements), None)["scaling.svg"]
    )


# --- trainer runs ----------------------------------------------------------------------------------


def test_a_trainer_run_drops_warmup_logs_and_takes_medians(tmp_path):
    run = write_run(tmp_path / "g2", 2, [10.0, 500.0, 600.0, 1000.0, 1200.0, 1100.0, 5000.0])
    m = load_run(run, "g2", warmup_logs=3)
    assert (m.series, m.world_size) == ("tiny FULL_SHARD", 2)
    assert m.tokens_per_s_per_gpu == 1150.0  # median of the last four: 1000, 1200, 1100, 5000
    assert m.source == "g2"
    assert m.device == "cpu"
    assert "median of 4 logged steps" in m.note
    assert load_run(run, "g2", warmup_logs=0).tokens_per_s_per_gpu == 1000.0


def test_a_metrics_file_is_read_with_the_run_info_next_to_it(tmp_path):
    run = write_run(tmp_path / "g1", 1, [1.0, 1.0, 1.0, 7.0], peak_mem_gib=2.5, step_time_s=0.25)
    m = load([str(run / "metrics.jsonl")], 3)[0]
    assert (m.series, m.world_size, m.tokens_per_s_per_gpu) == ("tiny FULL_SHARD", 1, 7.0)
    assert (m.peak_mem_gib, m.step_time_s) == (2.5, 0.25)


def test_the_world_size_comes_from_the_run_info(tmp_path):
    run = write_run(tmp_path / "r", 4, [100.0] * 5, info=run_info(4, model="llama2-7b", strategy="SHARD_GRAD_OP"))
    m = load_run(run, "r", 3)
    assert (m.series, m.world_size) == ("llama2-7b SHARD_GRAD_OP", 4)


def test_hybrid_shard_series_name_their_shard_group_size(tmp_path):
    info = run_info(8, model="llama2-7b", strategy="HYBRID_SHARD", mesh={"replicate": 2, "shard": 4})
    m = load_run(write_run(tmp_path / "h", 8, [100.0] * 5, info=info), "h", 3)
    assert m.series == "llama2-7b HYBRID_SHARD (shard groups of 4)"


def test_every_launch_of_a_run_drops_its_own_warmup(tmp_path):
    run = tmp_path / "resumed"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(run_info(2), indent=2))
    records = (
        [step_record(s, 2, 1.0) for s in (1, 2)]
        + [step_record(s, 2, 100.0) for s in (3, 4)]
        # a new job resumed the run from step 2: only the step going back says so
        + [step_record(s, 2, 1.0) for s in (3, 4)]
        + [step_record(s, 2, 200.0) for s in (5, 6)]
        # torchrun restarted the workers from the checkpoint of step 6: only restart_count says so
        + [step_record(s, 2, 1.0, restart_count=1) for s in (7, 8)]
        + [step_record(9, 2, 300.0, restart_count=1)]
    )
    write_jsonl(run / "metrics.jsonl", records)
    m = load_run(run, "resumed", warmup_logs=2)
    assert m.tokens_per_s_per_gpu == 200.0  # median of 100, 100, 200, 200, 300: no warm-up figure left
    assert "(3 launch(es))" in m.note


def test_a_run_with_only_warmup_logs_is_bad_input(tmp_path):
    run = write_run(tmp_path / "short", 1, [100.0, 100.0, 100.0])
    with pytest.raises(InputError) as err:
        load_run(run, "short", warmup_logs=3)
    assert str(err.value).startswith(
        f"{Path('short') / 'metrics.jsonl'}: step: all 3 logged steps (1 launch(es)) "
        "are warm-up with --warmup-logs 3; fix:"
    )


def test_a_logged_world_size_that_differs_from_the_run_info_is_bad_input(tmp_path):
    run = write_run(tmp_path / "r", 2, [100.0] * 4)
    write_jsonl(run / "metrics.jsonl", [step_record(1, 2, 1.0), step_record(2, 4, 1.0)])
    with pytest.raises(InputError) as err:
        load_run(run, "r", 0)
    assert (err.value.line, err.value.key) == (2, "world_size")
    assert "is 4 but r/run.json says 2" in err.value.message


def test_a_missing_run_info_key_names_the_line_of_its_parent(tmp_path):
    info = run_info(2)
    del info["config"]["parallelism"]["sharding_strategy"]
    run = write_run(tmp_path / "r", 2, [100.0] * 4, info=info)
    with pytest.raises(InputError) as err:
        load_run(run, "r", 0)
    text = (run / "run.json").read_text().splitlines()
    assert err.value.key == "config.parallelism.sharding_strategy"
    assert err.value.file == "r/run.json"
    assert text[err.value.line - 1].strip() == '"parallelism": {'


# --- table and charts ------------------------------------------------------------------------------


def test_markdown_table_has_a_row_per_point_and_escapes_pipes(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [bench_record("a|b", 1, 1000.0), bench_record("a|b", 2, 900.0)])
    lines = report.markdown_table(summarise(load([str(path)], 3))).splitlines()
    assert len(lines) == 4
    assert lines[0].split("|")[1].strip() == "series"
    assert set(lines[1]) <= {"|", "-", ":"}
    cells = [c.strip() for c in lines[3].replace("\\|", "/").split("|")[1:-1]]
    # The last cell, the predicted tokens/s, is "-": the record's config names no trainer settings.
    assert cells == ["a/b", "2", "900", "1,800", "4.1%", "90.0%", f"{8192 / 900:.4f}", "100.5", "1", "-"]
    assert len({len(line) for line in lines}) == 1  # padded columns


def chart(svg_bytes: bytes) -> ET.Element:
    return ET.fromstring(svg_bytes)


def test_scaling_svg_is_well_formed_with_one_polyline_per_series(scaling):
    points = summarise(load([str(scaling)], 3))
    root = chart(report.render(points, None)["scaling.svg"])
    assert root.tag == f"{SVG}svg"
    groups = root.findall(f".//{SVG}g[@class='series']")
    assert [g.get("data-series") for g in groups] == ["baseline", "eager", "fsdp2"]
    assert len(root.findall(f".//{SVG}polyline")) == 3
    for g in groups:
        assert len(g.findall(f"{SVG}polyline")) == 1
    fsdp2 = groups[2]
    coords = [tuple(map(float, xy.split(","))) for xy in fsdp2.find(f"{SVG}polyline").get("points").split()]
    assert len(coords) == 4
    xs = [x for x, _ in coords]
    # log2 axis: 1 -> 2 -> 4 -> 8 GPUs are equally spaced
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.11) == pytest.approx(xs[3] - xs[2], abs=0.11)
    ys = [y for _, y in coords]
    assert ys == sorted(ys)  # falling throughput is drawn lower (larger y) at each step
    # ideal scaling: a flat dashed line at the baseline's height across the series' range
    ideal = fsdp2.find(f"{SVG}line[@class='ideal']")
    assert float(ideal.get("y1")) == float(ideal.get("y2")) == ys[0]
    assert (float(ideal.get("x1")), float(ideal.get("x2"))) == (xs[0], xs[-1])
    assert groups[1].find(f"{SVG}line[@class='ideal']") is None  # one point: nothing to scale
    labels = [t.text for t in fsdp2.findall(f"{SVG}text")]
    assert labels == ["95%", "90%", "88%"]
    ticks = [t.text for t in root.findall(f".//{SVG}g[@class='ticks']/{SVG}text")]
    assert ticks[:4] == ["1", "2", "4", "8"]


def test_mfu_svg_has_one_polyline_per_series_and_percent_ticks(scaling):
    root = chart(report.render(summarise(load([str(scaling)], 3)), None)["mfu.svg"])
    assert len(root.findall(f".//{SVG}polyline")) == 3
    ticks = [t.text for t in root.findall(f".//{SVG}g[@class='ticks']/{SVG}text")]
    assert "0%" in ticks and any(t.endswith("%") and t != "0%" for t in ticks)


def test_rendering_is_byte_identical_and_svg_stays_ascii(tmp_path):
    path = write_jsonl(
        tmp_path / "b.jsonl",
        [bench_record("llama <7b> & \u00e9t\u00e9", 1, 1000.0), bench_record("llama <7b> & \u00e9t\u00e9", 4, 930.0)],
    )
    first = report.render(summarise(load([str(path)], 3)), None)
    second = report.render(summarise(load([str(path)], 3)), None)
    assert first == second
    for name in ("scaling.svg", "mfu.svg"):
        assert first[name].isascii()
        root = chart(first[name])
        assert root.find(f".//{SVG}g[@class='series']").get("data-series") == "llama <7b> & \u00e9t\u00e9"


def test_nice_ticks_cover_the_top_with_round_steps():
    assert nice_ticks(12000.0) == [0, 2500, 5000, 7500, 10000, 12500]
    assert nice_ticks(0.52) == pytest.approx([0, 0.2, 0.4, 0.6])
    assert nice_ticks(0.0) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    for top in (3.0, 47.0, 999.0, 1e6):
        ticks = nice_ticks(top)
        assert ticks[-1] >= top and len(ticks) <= 8 and math.isclose(ticks[1] * 2, ticks[2])
