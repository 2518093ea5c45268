"""Small matrices and helpers shared by the generator tests (test_matrix_*, test_plan_*, test_expand_*)."""

from __future__ import annotations

from pathlib import Path

from generators import matrix as matrix_mod
from generators.plan import plan, plan_runs

# Two clusters: one with a single instance type, one with two (so instance_type must be named).
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
  fsdp-mixed:
    region: us-east-1
    availability_zones: [us-east-1a]
    instance_types: [p4d.24xlarge, p5en.48xlarge]
    namespace: research
"""

RUNS = """\
defaults:
  cluster: fsdp-p5
  trainer:
    data:
      path: /shared/data/samsum/train.jsonl
axes:
  model: [llama2-7b, llama2-13b]
  nodes: [1, 2]
"""

GOOD = HEADER + RUNS


def load(text: str, file: str = "m.yaml") -> matrix_mod.Matrix:
    return matrix_mod.load(file, text)


def plans(text: str, file: str = "m.yaml"):
    """Every run's Plan, in matrix order."""
    m = load(text, file)
    return plan_runs(m, matrix_mod.expand(m))


def cluster_plans(text: str, file: str = "m.yaml"):
    """The per-cluster plans the renderers take."""
    m = load(text, file)
    return plan(m, matrix_mod.expand(m))


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line containing `needle`."""
    seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            seen += 1
            if seen == nth:
                return number
    raise AssertionError(f"{needle!r} not in the text")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (to prove a failed run changed nothing)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
