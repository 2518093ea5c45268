"""A run that does not fit its GPUs' memory is refused, when the overlays are written, with the fix
`--plan` prints for it (the cheapest change that fits: nodes only where more nodes help, else
checkpointing, sharding, fp8 or a smaller batch), and that fix, written into the matrix, makes it
expand. Run as a user runs it: the real command in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

HEADER = """\
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
    # Room for a 70B run's checkpoints on the shared volume (generators/plan/footprint.py).
    shared_storage_gib: 4800
  fsdp-one:
    region: us-west-2
    availability_zones: [us-west-2a]
    instance_types: [p5.48xlarge]
    namespace: one
    max_nodes: 1
defaults:
  trainer:
    data:
      path: /shared/data/samsum/train.jsonl
    training:
      batch_size_per_gpu: 3
include:
"""


def matrix_text(entries: list[dict[str, object]]) -> str:
    return HEADER + "".join("  - " + "\n    ".join(f"{k}: {v}" for k, v in entry.items()) + "\n" for entry in entries)


def expand(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "generators" / "expand.py"), "matrix.yaml", *args],
        capture_output=True,
        text=True,
        cwd=folder,
    )


def plan_fixes(folder: Path) -> dict[str, str]:
    """Run name -> the 'Cheapest fix' --plan prints for it."""
    result = expand(folder, "--plan")
    assert result.returncode == 1, result.stderr
    return dict(re.findall(r"^- (\S+): .*\. Cheapest fix: (.+)\.$", result.stdout, re.M))


def settings(fix: str) -> dict[str, str]:
    """'nodes: 3 (about ...)' or 'a: 1, b: 2 (the same global batch) (about ...)' -> {key: value}."""
    changes = re.sub(r" \(.*$", "", fix)
    return dict(pair.split(": ", 1) for pair in changes.split(", "))


FITS = {"cluster": "fsdp-p5", "model": "llama2-7b", "nodes": 1}


@pytest.mark.parametrize(
    "unfit, first_key",
    [
        # 70B on one node: only more nodes make it fit.
        ({"cluster": "fsdp-p5", "model": "llama2-70b", "nodes": 1}, "nodes"),
        # A cluster of one node: more nodes cannot help, so the fix is another change.
        (
            {
                "cluster": "fsdp-one",
                "model": "llama2-13b",
                "nodes": 1,
                "trainer.training.batch_size_per_gpu": 16,
                "trainer.parallelism.activation_checkpointing": "none",
            },
            "trainer.",
        ),
    ],
    ids=["more-nodes", "no-more-nodes"],
)
def test_an_unfit_run_is_refused_with_the_fix_plan_gives_and_the_fix_works(tmp_path, unfit, first_key):
    entries = [dict(FITS), dict(unfit)]
    matrix = tmp_path / "matrix.yaml"
    text = matrix_text(entries)
    matrix.write_text(text)
    out = tmp_path / "out"

    result = expand(tmp_path, "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert not out.exists()
    [line] = result.stderr.strip().splitlines()
    assert "Traceback" not in line and "exclude" not in line
    m = re.fullmatch(
        r"error: matrix\.yaml:(\d+): (\S+): (.+) \(run (\S+)\); fix: set (.+): the cheapest change .*",
        line,
    )
    assert m, line
    number, key, reason, name, fix = m.groups()
    assert "needs about" in reason and "GiB per GPU" in reason

    # The same fix as --plan's for the same run, not a second opinion.
    fixes = plan_fixes(tmp_path)
    assert fixes[name] == fix
    changes = settings(fix)
    assert next(iter(changes)).startswith(first_key)
    if first_key != "nodes":
        assert "nodes" not in changes
    # The line and key are those of the setting the fix changes first, in the entry of the run.
    assert key.startswith("include[1]") and key.endswith(next(iter(changes)))
    assert text.splitlines()[int(number) - 1].strip().lstrip("- ").startswith(next(iter(changes)).split(".")[0])

    # Written into the run's entry, the fix makes the matrix expand.
    entries[1].update(changes)
    matrix.write_text(matrix_text(entries))
    fixed = expand(tmp_path, "--out", str(out))
    assert fixed.returncode == 0, fixed.stderr
    assert len(list((out / "runs").glob("*/*/kustomization.yaml"))) == 2
