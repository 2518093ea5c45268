"""A misspelt key is hinted at its own level: a dotted key in a run's settings gets the closest key of
the mapping its unknown part belongs to (never the run's top-level fields), spelt whole as it would be
written. Run as a user runs it: the real command in a subprocess, on the repository's matrix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matrix_support import line_of
from support import REPO_ROOT

from generators.matrix.schema import trainer_schema

SEED = (REPO_ROOT / "matrix.yaml").read_text()
# The keys of trainer.checkpoint, as the trainer declares them (the hint lists them all).
CHECKPOINT_KEYS = ", ".join(sorted(trainer_schema()["checkpoint"]))
TRAINER_KEYS = "checkpoint, data, metrics, model, parallelism, training"
# The first include entry's last line: a key added after it belongs to that entry.
INCLUDE_0 = "    trainer.parallelism.sharding_strategy: HYBRID_SHARD\n  - cluster: fsdp-p4de"


def expand(matrix: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "generators" / "expand.py"), matrix.name, *args],
        capture_output=True,
        text=True,
        cwd=matrix.parent,
    )


def in_include(key_line: str) -> str:
    assert INCLUDE_0 in SEED
    return SEED.replace(INCLUDE_0, INCLUDE_0.replace("\n", f"\n    {key_line}\n", 1), 1)


def in_defaults_trainer(key_line: str) -> str:
    assert "    checkpoint:\n      # Sharded" in SEED
    return SEED.replace("    checkpoint:\n      # Sharded", f"    {key_line}\n    checkpoint:\n      # Sharded", 1)


def in_axes(key_line: str) -> str:
    return SEED.replace("  nodes: [1, 2, 4, 8, 16]\n", f"  nodes: [1, 2, 4, 8, 16]\n  {key_line}\n", 1)


@pytest.mark.parametrize(
    "text, needle, key, suggestion, level, known, repaired",
    [
        (
            in_include("trainer.checkpoint.interval_step: 5"),
            "trainer.checkpoint.interval_step: 5",
            "include[0].trainer.checkpoint.interval_step",
            "trainer.checkpoint.interval_steps",
            "trainer.checkpoint",
            CHECKPOINT_KEYS,
            "trainer.checkpoint.interval_steps: 5",
        ),
        (
            in_defaults_trainer("checkpoint.keep_lst: 3"),
            "checkpoint.keep_lst: 3",
            "defaults.trainer.checkpoint.keep_lst",
            "checkpoint.keep_last",
            "trainer.checkpoint",
            CHECKPOINT_KEYS,
            "checkpoint.keep_last: 3",
        ),
        (
            in_include("trainer.checkpont.interval_steps: 5"),
            "trainer.checkpont.interval_steps: 5",
            "include[0].trainer.checkpont.interval_steps",
            "trainer.checkpoint.interval_steps",
            "trainer",
            TRAINER_KEYS,
            "trainer.checkpoint.interval_steps: 5",
        ),
        (
            # One value: a second would double the seed's runs, more than its shared volumes hold.
            in_axes("trainer.checkpoint.interval_step: [300]"),
            "trainer.checkpoint.interval_step: [300]",
            "axes.trainer.checkpoint.interval_step",
            "trainer.checkpoint.interval_steps",
            "trainer.checkpoint",
            CHECKPOINT_KEYS,
            "trainer.checkpoint.interval_steps: [300]",
        ),
    ],
    ids=["include-dotted", "under-trainer-dotted", "middle-part", "axis"],
)
def test_dotted_key_is_hinted_among_the_keys_of_its_own_level(
    tmp_path, text, needle, key, suggestion, level, known, repaired
):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    out = tmp_path / "out"
    result = expand(matrix, "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: {matrix.name}:{line_of(text, needle)}: {key}: unknown key "), lines[0]
    assert f"did you mean '{suggestion}'?" in lines[0]
    assert f"known keys of {level}: {known})" in lines[0]
    # The run's own fields are no hint for a trainer key.
    assert "gpus_per_node" not in lines[0] and "rdzv_backend" not in lines[0]
    assert not out.exists()

    # The suggestion is the fix: written in its place, the matrix expands.
    matrix.write_text(text.replace(needle, repaired, 1))
    fixed = expand(matrix, "--out", str(out), "--plan-out", str(tmp_path / "docs"))
    assert fixed.returncode == 0, fixed.stderr
    assert any(out.rglob("kustomization.yaml"))


def test_a_key_below_a_value_says_the_value_takes_no_keys(tmp_path):
    text = in_include("trainer.training.lr.warm: 1")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    result = expand(matrix, "--list")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"error: matrix.yaml:{line_of(text, 'trainer.training.lr.warm: 1')}: include[0].trainer.training.lr.warm: "
        "unknown key 'warm': trainer.training.lr is a value, not a mapping; "
        "fix: set trainer.training.lr itself, not keys under it"
    )


def test_a_misspelt_run_field_is_still_hinted_among_the_run_fields(tmp_path):
    text = in_include("node: 2")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    result = expand(matrix, "--list")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "include[0].node: unknown key 'node'" in line
    assert "did you mean 'nodes'? known keys here: active_deadline_s, cluster," in line
