"""`expand.py MATRIX --plan --format json|csv`: the plan table's rows and columns for scripts, on
stdout, with the figures as numbers. Run as a user runs it: the real command in a subprocess."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

SEED = REPO_ROOT / "matrix.yaml"
# The table's columns (docs/plan.md) -> the fields that carry each of them.
COLUMNS = {
    "run": ("run", "refused"),
    "GPUs": ("gpus",),
    "GPU memory, GiB per GPU (of)": ("gpu_memory_gib_per_gpu", "gpu_memory_of_gib"),
    "host memory loading, GiB per node (of)": ("host_memory_loading_gib_per_node", "host_memory_of_gib"),
    "tokens/s per GPU": ("tokens_per_s_per_gpu", "uncalibrated"),
    "start, min": ("start_min",),
    "model load, min": ("model_load_min",),
    "data staging, min": ("data_staging_min",),
    "saves, min": ("saves_min", "saves", "save_blocking_s"),
    "final save and export, min": ("final_save_and_export_min",),
    "hours": ("hours",),
    "GPU-hours": ("gpu_hours",),
    "cost, USD": ("cost_usd", "reserved"),
}
FIELDS = {"cluster", "reason", "fix"} | {f for fields in COLUMNS.values() for f in fields}


def expand(matrix: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "generators" / "expand.py"), str(matrix), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )


def table_rows(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows (by run name) of the plan's per-run Markdown table."""
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    header = cells[0]
    return header, {row[0]: row for row in cells[1:] if len(row) == len(header)}


def number(cell: str) -> float:
    return float(re.match(r"[\d,.]+", cell).group(0).replace(",", ""))


def test_json_has_a_row_per_run_with_the_tables_columns_as_numbers():
    table = expand(SEED, "--plan")
    assert table.returncode == 0, table.stderr
    header, rows = table_rows(table.stdout)
    assert tuple(header) == tuple(COLUMNS)

    result = expand(SEED, "--plan", "--format", "json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert isinstance(records, list)
    assert [r["run"] for r in records] == list(rows)  # every run of the table, in its order
    for r in records:
        assert set(r) == FIELDS
        row = dict(zip(header, rows[r["run"]], strict=True))
        assert r["refused"] is False and r["reason"] == r["fix"] == ""
        assert r["gpus"] == int(row["GPUs"])
        assert r["gpu_memory_gib_per_gpu"] == number(row["GPU memory, GiB per GPU (of)"])
        assert f"({r['gpu_memory_of_gib']}," in row["GPU memory, GiB per GPU (of)"]
        assert round(r["tokens_per_s_per_gpu"]) == number(row["tokens/s per GPU"])
        assert ("uncalibrated" in row["tokens/s per GPU"]) == bool(r["uncalibrated"])
        assert r["start_min"] == number(row["start, min"])
        assert r["hours"] == pytest.approx(number(row["hours"]), abs=0.0051)  # the table shows 2 digits
        assert r["cost_usd"] == pytest.approx(number(row["cost, USD"]), abs=0.006)
        assert r["reserved"] is ("(reserved)" in row["cost, USD"])
        assert r["cluster"] in ("fsdp-p4de", "fsdp-p5")


def test_csv_has_a_header_and_the_same_rows_as_json():
    as_json = json.loads(expand(SEED, "--plan", "--format", "json").stdout)
    result = expand(SEED, "--plan", "--format", "csv")
    assert result.returncode == 0, result.stderr
    reader = csv.DictReader(io.StringIO(result.stdout))
    assert reader.fieldnames is not None and set(reader.fieldnames) == FIELDS
    assert reader.fieldnames[0] == "run"
    rows = list(reader)
    assert [r["run"] for r in rows] == [r["run"] for r in as_json]
    for got, want in zip(rows, as_json, strict=True):
        assert float(got["cost_usd"]) == want["cost_usd"]
        assert int(got["gpus"]) == want["gpus"]
        assert got["refused"] == "false"


def test_a_refused_run_is_a_row_with_its_fix_and_the_command_exits_1(tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(SEED.read_text().replace("  - {model: llama2-70b, nodes: 1}\n", "", 1))
    table = expand(matrix, "--plan")
    fixes = dict(re.findall(r"^- (\S+): .*\. Cheapest fix: (.+)\.$", table.stdout, re.M))
    assert len(fixes) == 2
    result = expand(matrix, "--plan", "--format", "json")
    assert result.returncode == 1
    assert "2 runs cannot fit" in result.stderr
    refused = {r["run"]: r for r in json.loads(result.stdout) if r["refused"]}
    assert {name: r["fix"] for name, r in refused.items()} == fixes
    # Like the table's row, the refused run's figures are there, its memory above the GPU's.
    assert all(r["gpu_memory_gib_per_gpu"] > r["gpu_memory_of_gib"] for r in refused.values())
    assert all(r["reason"].startswith("llama2-70b needs about 141 GiB per GPU") for r in refused.values())


@pytest.mark.parametrize(
    "args, key",
    [
        (["--format", "json"], "--format"),
        (["--plan", "--format", "json", "--base", "HEAD"], "--format"),
    ],
)
def test_format_outside_a_plain_plan_is_one_line_and_exit_2(args, key):
    result = expand(SEED, *args)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {key}") and "fix: " in line
    assert result.stdout == ""


def test_an_unknown_format_is_refused_by_the_option():
    result = expand(SEED, "--plan", "--format", "yaml")
    assert result.returncode == 2
    assert "'yaml' is not one of 'table', 'json', 'csv'" in result.stderr
