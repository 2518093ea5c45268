"""The report CLI through Click's CliRunner (and once as a real process): the table on stdout, the
files under --out, determinism, and bad input as one line on stderr with exit 2 and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from report_support import bench_record, run_info, write_jsonl, write_run
from support import REPO_ROOT, cli_run

from generators.report import main


def invoke(*args: str):
    return cli_run(main, [str(a) for a in args])


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "bench.jsonl",
        [
            bench_record("fsdp2", 1, 10000.0),
            bench_record("fsdp2", 2, 9700.0),
            bench_record("fsdp1", 1, 6000.0),
            bench_record("fsdp1", 2, 5400.0),
        ],
    )


def test_table_on_stdout_and_nothing_written_without_out(results, tmp_path):
    before = sorted(tmp_path.rglob("*"))
    result = invoke(results)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 6
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in lines[2:]}
    assert set(rows) == {("fsdp1", "1"), ("fsdp1", "2"), ("fsdp2", "1"), ("fsdp2", "2")}
    assert "97.0%" in rows[("fsdp2", "2")] and "90.0%" in rows[("fsdp1", "2")]
    assert result.stderr == ""
    assert sorted(tmp_path.rglob("*")) == before


def test_out_gets_report_and_charts_byte_identical_on_every_run(results, tmp_path):
    out = tmp_path / "report"
    first = invoke(results, "--out", out)
    assert first.exit_code == 0, first.output
    # The three files, and the writer's record of them (what it may delete on a later run).
    assert sorted(p.name for p in out.iterdir()) == [".fsdp-gitops-report.files", "mfu.svg", "report.md", "scaling.svg"]
    assert "3 created, 0 updated" in first.stderr
    md = (out / "report.md").read_text()
    assert first.stdout.strip() in md  # the same table
    assert "](scaling.svg)" in md and "](mfu.svg)" in md
    assert f"{results}:2 (NVIDIA H200): `torchrun --nproc_per_node=2 benchmarks/train_bench.py --name fsdp2`" in md
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}
    again = invoke(results, "--out", out)
    assert "0 created, 0 updated" in again.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot


def test_baseline_world_size_option(results):
    result = invoke(results, "--baseline-world-size", "2")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("| fsdp1 ") and "|    1 |" in line)
    assert "111.1%" in row


def test_runs_from_the_command_line_as_a_script(results):
    proc = subprocess.run(
        [sys.executable, "generators/report.py", str(results)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("| series ")


def line(record: dict) -> str:
    return json.dumps(record) + "\n"


def without(record: dict, key: str) -> dict:
    return {k: v for k, v in record.items() if k != key}


GOOD = bench_record("s", 1, 100.0)

# (case id, files to write {name: text or bytes}, arguments, the fragments the one error line holds)
BAD_INPUTS = [
    ("missing-file", {}, ["nope.jsonl"], ["nope.jsonl: no such file or directory; fix:"]),
    ("empty-file", {"e.jsonl": "\n\n"}, ["e.jsonl"], ["e.jsonl: holds no records (empty input); fix:"]),
    ("no-input", {}, [], ["INPUT: no INPUT given (empty input); fix:"]),
    ("not-json", {"b.jsonl": line(GOOD) + "{oops\n"}, ["b.jsonl"], ["b.jsonl:2: not JSON (", "column 2)"]),
    ("not-an-object", {"b.jsonl": "[1, 2]\n"}, ["b.jsonl"], ["b.jsonl:1: a JSON list, not an object"]),
    (
        "missing-key",
        {"b.jsonl": line(GOOD) + line(without(GOOD, "tokens_per_s_per_gpu"))},
        ["b.jsonl"],
        ["b.jsonl:2: tokens_per_s_per_gpu: missing; fix: pass JSON lines written by benchmarks/common.py emit()"],
    ),
    (
        "string-world-size",
        {"b.jsonl": line({**GOOD, "world_size": "2"})},
        ["b.jsonl"],
        ['b.jsonl:1: world_size: must be an integer >= 1, got "2"'],
    ),
    (
        "bool-world-size",
        {"b.jsonl": line({**GOOD, "world_size": True})},
        ["b.jsonl"],
        ["b.jsonl:1: world_size: must be an integer >= 1, got true"],
    ),
    (
        "nan-throughput",
        {"b.jsonl": line(GOOD).replace('"tokens_per_s_per_gpu": 100.0', '"tokens_per_s_per_gpu": NaN')},
        ["b.jsonl"],
        ["b.jsonl:1: tokens_per_s_per_gpu: must be a finite number > 0, got NaN"],
    ),
    (
        "zero-throughput",
        {"b.jsonl": line({**GOOD, "tokens_per_s_per_gpu": 0})},
        ["b.jsonl"],
        ["b.jsonl:1: tokens_per_s_per_gpu: must be a finite number > 0, got 0"],
    ),
    ("empty-name", {"b.jsonl": line({**GOOD, "name": " "})}, ["b.jsonl"], ["b.jsonl:1: name: must be a non-empty"]),
    (
        "not-utf8",
        {"b.jsonl": line(GOOD).encode() + b'{"name": "\xff"}\n'},
        ["b.jsonl"],
        ["b.jsonl:2: is not UTF-8 text"],
    ),
    (
        "baseline-zero",
        {"b.jsonl": line(GOOD)},
        ["b.jsonl", "--baseline-world-size", "0"],
        ["--baseline-world-size: must be at least 1, got 0"],
    ),
    (
        "baseline-absent",
        {"b.jsonl": line(GOOD)},
        ["b.jsonl", "--baseline-world-size", "8"],
        ["--baseline-world-size: series 's' has no measurement at 8 GPUs (it has 1)"],
    ),
    (
        "negative-warmup",
        {"b.jsonl": line(GOOD)},
        ["b.jsonl", "--warmup-logs", "-1"],
        ["--warmup-logs: must be 0 or more, got -1"],
    ),
    (
        "out-is-a-file",
        {"b.jsonl": line(GOOD), "taken": "x"},
        ["b.jsonl", "--out", "taken"],
        ["--out taken: is a file, not a directory"],
    ),
]


@pytest.mark.parametrize("files, args, fragments", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, files, args, fragments):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        if isinstance(content, bytes):
            Path(name).write_bytes(content)
        else:
            Path(name).write_text(content)
    out_args = [] if "--out" in args else ["--out", "report"]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke(*args, *out_args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ")
    for fragment in fragments:
        assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_bad_trainer_runs_name_the_file_line_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(Path("good"), 1, [100.0] * 5)
    Path("empty-dir").mkdir()
    no_info = write_run(Path("no-info"), 1, [100.0] * 5)
    (no_info / "run.json").unlink()
    broken = write_run(Path("broken"), 1, [100.0] * 5)
    (broken / "metrics.jsonl").write_text(
        (broken / "metrics.jsonl").read_text().replace('"step_time_s": 0.1', '"step_time_s": -1', 1)
    )
    info = run_info(1)
    del info["world_size"]
    write_run(Path("no-world"), 1, [100.0] * 5, info=info)
    cases = {
        "empty-dir": "empty-dir: no metrics.jsonl in this directory; fix: pass a trainer run directory",
        "no-info": "no-info/run.json: no such file; fix:",
        "broken": "broken/metrics.jsonl:1: step_time_s: must be a finite number > 0, got -1",
        "no-world": "no-world/run.json: world_size: missing; fix:",
    }
    for run, expected in cases.items():
        result = invoke("good", run, "--out", "report")
        assert result.exit_code == 2, (run, result.output)
        assert result.stderr.startswith(f"error: {expected}"), (run, result.stderr)
        assert len(result.stderr.splitlines()) == 1
        assert not Path("report").exists()


def test_the_committed_scaling_chart_is_what_the_report_writes(tmp_path, cli, monkeypatch):
    """docs/observability.md shows docs/generated/scaling/: the report over the committed benchmarks."""
    inputs = ["benchmarks/results/h200x1-final.jsonl", "benchmarks/results/h200x2-llama2-7b.jsonl"]
    out = tmp_path / "scaling"
    monkeypatch.chdir(REPO_ROOT)  # the report names its inputs as given
    result = cli(main, [*inputs, "--out", str(out)])
    assert result.exit_code == 0, result.output
    committed = REPO_ROOT / "docs" / "generated" / "scaling"
    for name in ("report.md", "scaling.svg", "mfu.svg"):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), (
            f"docs/generated/scaling/{name} is stale: run python generators/report.py {' '.join(inputs)} "
            "--out docs/generated/scaling"
        )
