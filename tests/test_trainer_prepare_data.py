"""python -m trainer.prepare_data: a dataset staged once, in the trainer's format, with a marker last.

Real `datasets` loading of local folders the tests make (offline: HF_DATASETS_OFFLINE and
HF_HUB_OFFLINE are set, and the cache is under the test's directory), through the real CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

from trainer.config import DataConfig
from trainer.data import ByteTokenizer, build_dataset

# Every test starts the CLI, which imports `datasets` (seconds each).
pytestmark = pytest.mark.slow

SAMSUM_ROWS = [
    {"id": "1", "dialogue": "Ann: hi\nBob: hello", "summary": "Ann and Bob greet."},
    {"id": "2", "dialogue": "Ann: lunch?\nBob: yes", "summary": "They will have lunch."},
    {"id": "3", "dialogue": "Ann: ok", "summary": None},  # a hub dataset's broken row: skipped, counted
    {"id": "4", "dialogue": "Bob: late\nAnn: fine", "summary": "Bob is late."},
]


def prep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, HF_HOME=str(tmp_path / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT)
    )
    return subprocess.run(
        [sys.executable, "-m", "trainer.prepare_data", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def tree(path: Path) -> dict[str, str]:
    """Every file under `path` with its content hash (an absent path is an empty tree)."""
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def samsum_folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SAMSUM_ROWS))
    return src


@pytest.mark.slow
def test_local_folder_is_staged_once_in_the_trainers_format(tmp_path):
    src, out = samsum_folder(tmp_path), tmp_path / "data" / "samsum"
    done = prep(tmp_path, "--dataset", str(src), "--format", "samsum", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "3 rows (1 skipped" in done.stdout
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert rows == [{"dialogue": r["dialogue"], "summary": r["summary"]} for r in SAMSUM_ROWS if r["summary"]]
    marker = json.loads((out / "_COMPLETE").read_text())
    assert marker["rows"] == 3 and marker["skipped_rows"] == 1 and marker["format"] == "samsum"
    assert marker["sha256"] == hashlib.sha256((out / "train.jsonl").read_bytes()).hexdigest()
    # The trainer reads what was staged.
    dataset = build_dataset(
        DataConfig(path=str(out / "train.jsonl"), format="samsum", seq_len=64), ByteTokenizer(), 512, 0
    )
    assert dataset.num_examples == 3

    before = tree(out)
    again = prep(tmp_path, "--dataset", str(src), "--format", "samsum", "--out", str(out))
    assert again.returncode == 0 and again.stdout.startswith("already prepared:"), again
    assert tree(out) == before


@pytest.mark.slow
def test_an_interrupted_run_is_redone(tmp_path):
    src, out = samsum_folder(tmp_path), tmp_path / "data" / "samsum"
    out.mkdir(parents=True)
    # What a run killed before its marker leaves: a half-written file aside and a stale one.
    (out / ".tmp-train.jsonl").write_text('{"dialogue": "half')
    (out / "train.jsonl").write_text('{"dialogue": "stale", "summary": "stale"}\n')
    done = prep(tmp_path, "--dataset", str(src), "--format", "samsum", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert len((out / "train.jsonl").read_text().splitlines()) == 3
    assert (out / "_COMPLETE").is_file() and not (out / ".tmp-train.jsonl").exists()


@pytest.mark.slow
def test_saved_dataset_folder_in_alpaca_format(tmp_path):
    import datasets

    src, out = tmp_path / "saved", tmp_path / "data" / "alpaca"
    datasets.Dataset.from_list(
        [
            {"instruction": "Add 2 and 3.", "input": None, "output": "5", "text": "x"},
            {"instruction": "Translate.", "input": "hola", "output": "hello", "text": "y"},
        ]
    ).save_to_disk(str(src))
    done = prep(tmp_path, "--dataset", str(src), "--format", "alpaca", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert rows == [
        {"instruction": "Add 2 and 3.", "input": "", "output": "5"},
        {"instruction": "Translate.", "input": "hola", "output": "hello"},
    ]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path):
    src, data = samsum_folder(tmp_path), tmp_path / "data"
    (data / "other").mkdir(parents=True)
    (data / "other" / "_COMPLETE").write_text(json.dumps({"dataset": "x/y", "format": "samsum", "split": "train"}))
    (data / "afile").write_text("")
    cases = {
        "no column": ["--dataset", str(src), "--format", "alpaca", "--out", str(data / "a")],
        "split": ["--dataset", str(src), "--format", "samsum", "--out", str(data / "b"), "--split", "test"],
        "not found": ["--dataset", str(tmp_path / "missing"), "--format", "samsum", "--out", str(data / "c")],
        "already holds": ["--dataset", str(src), "--format", "samsum", "--out", str(data / "other")],
        "is a file": ["--dataset", str(src), "--format", "samsum", "--out", str(data / "afile")],
        "invalid choice": ["--dataset", str(src), "--format", "csv", "--out", str(data / "d")],
    }
    before = tree(data)
    for expected, args in cases.items():
        done = prep(tmp_path, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (expected, done)
        assert expected in lines[0], (expected, lines)
        assert tree(data) == before, expected


def test_two_runs_at_once_write_once(tmp_path):
    src, out = samsum_folder(tmp_path), tmp_path / "data" / "samsum"
    env = dict(
        os.environ, HF_HOME=str(tmp_path / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT)
    )
    cmd = [sys.executable, "-m", "trainer.prepare_data", "--dataset", str(src), "--format", "samsum", "--out", str(out)]
    procs = [
        subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], results
    said = sorted(stdout.split()[0] for stdout, _ in results)
    assert said == ["already", "prepared"], results
    assert len((out / "train.jsonl").read_text().splitlines()) == 3
