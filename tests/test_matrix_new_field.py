"""A new run field is one declaration in generators/matrix/schema.py plus the code that uses it: in a
copy of the generators with exactly those two edits, the matrix accepts, checks and expands the field,
the run's name changes with it (the configuration hash covers every run field), and the overlay
carries it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from matrix_support import GOOD
from support import REPO_ROOT

FIELD = """    name: str = run_field("")
    # PriorityClass of the job's pods; "" for the cluster's default.
    priority_class: str = run_field("")
"""
ANCHOR = '        {"op": "replace", "path": f"{_CONTAINER}/command", "value": torchrun_command(p)},\n'
USE = (
    ANCHOR
    + """        *([{"op": "add", "path": f"{_POD}/priorityClassName", "value": p.run.priority_class}]
          if p.run.priority_class else []),
"""
)


def edited_copy(root: Path) -> Path:
    """generators/, trainer/, base/ and pyproject.toml copied, with the field declared and used: one edit each."""
    for name in ("generators", "trainer", "base"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")  # the commands' --version
    edits = {
        "generators/matrix/schema.py": ('    name: str = run_field("")\n', FIELD),
        "generators/render/runs.py": (ANCHOR, USE),
    }
    for rel, (old, new) in edits.items():
        path = root / rel
        text = path.read_text()
        assert text.count(old) == 1, f"{rel}: the anchor of the edit moved"
        path.write_text(text.replace(old, new))
    return root


def expand(root: Path, matrix_text: str) -> subprocess.CompletedProcess:
    (root / "m.yaml").write_text(matrix_text)
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, str(root / "generators/expand.py"), str(root / "m.yaml"), "--out", str(root / "overlays")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


@pytest.mark.slow
def test_a_new_run_field_is_one_schema_line_plus_its_use(tmp_path):
    root = edited_copy(tmp_path)
    plain = expand(root, GOOD)
    assert plain.returncode == 0, plain.stderr
    names = {p.name for p in (root / "overlays/runs/fsdp-p5").iterdir()}

    shutil.rmtree(root / "overlays")
    with_field = expand(root, GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  priority_class: gpu-high\n"))
    assert with_field.returncode == 0, with_field.stderr
    runs = sorted((root / "overlays/runs/fsdp-p5").iterdir())
    assert len(runs) == 4 and not names & {p.name for p in runs}  # new configuration, new names
    for run in runs:
        ops = yaml.safe_load((run / "pytorchjob.run.yaml").read_text())
        assert {
            "op": "add",
            "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/priorityClassName",
            "value": "gpu-high",
        } in ops

    bad = expand(root, GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  priority_class: 3\n"))
    assert bad.returncode == 2
    assert "defaults.priority_class: got 3 (int); must be a string" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
