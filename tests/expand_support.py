"""The generators' write-path tests' repository copy (tests/test_expand_write_paths.py and, at mount
points, cluster/test_expand_mount_points.py): the committed overlays/ and docs/generated/ with
matrix.yaml and a second matrix, the commands pointed at the copy, and the code beside it for
`python generators/<command>.py` of that copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from matrix_support import HEADER
from support import REPO_ROOT

OTHER_MATRIX = (
    HEADER
    + """\
defaults:
  cluster: fsdp-p5
  model: tiny
  nodes: 1
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
axes:
  rev: [0, 1]
"""
)


def repository_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the repository's committed generated files and its matrix, with a second matrix
    (other-matrix.yaml, OTHER_MATRIX); the commands (in process) take it for their repository, run from
    it, until the test ends (monkeypatch)."""
    from generators import cluster, expand

    root = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "overlays", root / "overlays")
    shutil.copytree(REPO_ROOT / "docs" / "generated", root / "docs" / "generated")
    shutil.copy2(REPO_ROOT / "matrix.yaml", root / "matrix.yaml")
    (root / "other-matrix.yaml").write_text(OTHER_MATRIX)
    for module in (expand, cluster):
        monkeypatch.setattr(module, "REPO_ROOT", root)
    monkeypatch.setattr(expand, "DEFAULT_OUT", root / "overlays")
    monkeypatch.setattr(expand, "DEFAULT_PLAN_OUT", root / "docs" / "generated")
    monkeypatch.setattr(cluster, "DEFAULT_OUT", root / "overlays" / "provisioning")
    monkeypatch.chdir(root)
    return root


def with_code(repo: Path) -> Path:
    """`repo` with the code beside it (generators/, trainer/, pyproject.toml), for
    `python generators/<command>.py` of that checkout."""
    for code in ("generators", "trainer"):
        shutil.copytree(REPO_ROOT / code, repo / code, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO_ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo
