"""A matrix can compare bf16 and fp8 runs: the generator's public CLI plans both (with the memory
model's estimate) and writes each run's precision into its trainer config; fp8-only settings on a bf16
run are one line of bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from support import REPO_ROOT

MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository:
  url: https://github.com/example-org/fsdp-gitops
  branch: main
clusters:
  fsdp-p5:
    region: us-west-2
    availability_zones: [us-west-2a]
    instance_types: [p5.48xlarge]
defaults:
  cluster: fsdp-p5
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
axes:
  model: [llama3.1-8b]
  nodes: [2]
  trainer.parallelism.precision: [bf16, fp8]
"""


def expand(matrix: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "generators/expand.py", str(matrix), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_matrix_compares_bf16_and_fp8(tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(MATRIX)
    listing = expand(matrix, "--list")
    assert listing.returncode == 0, listing.stderr
    rows = [line for line in listing.stdout.splitlines() if "-p5-n2-" in line]
    assert len(rows) == 2 and len({r.split()[0] for r in rows}) == 2
    written = expand(matrix, "--out", str(tmp_path / "out"))
    assert written.returncode == 0, written.stderr
    configs = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "out").rglob("train.yaml"))]
    assert sorted(c["parallelism"]["precision"] for c in configs) == ["bf16", "fp8"]
    assert all(c["parallelism"]["fp8_all_gather"] is False for c in configs)


def test_fp8_all_gather_on_a_bf16_run_is_bad_input(tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        MATRIX.replace("[bf16, fp8]", "[bf16]").replace(
            "    data: {path: /shared/data/samsum/train.jsonl}",
            "    data: {path: /shared/data/samsum/train.jsonl}\n    parallelism: {fp8_all_gather: true}",
        )
    )
    result = expand(matrix, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "fp8_all_gather" in lines[0] and "precision fp8" in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()
