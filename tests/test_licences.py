"""The project's licence is there for a company to adopt it, and every model and dataset format the
repository names has its terms written down (docs/licences.md)."""

from __future__ import annotations

import tomllib

import yaml
from support import REPO_ROOT

from trainer.catalog import MODELS
from trainer.data import FIELDS

PAGE = (REPO_ROOT / "docs" / "licences.md").read_text()


def test_the_repository_is_apache_2_0_in_its_licence_file_and_its_package_metadata():
    text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a pointer to it
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_every_catalog_model_with_weights_has_its_licence_row():
    for name, arch in MODELS.items():
        if arch.hf_id:
            assert f"`{name}`" in PAGE, f"{name} ({arch.hf_id}) has no row in docs/licences.md"


def test_every_data_format_and_every_format_a_matrix_names_has_its_licence_row():
    named = set(FIELDS)
    for matrix in [REPO_ROOT / "matrix.yaml", *(REPO_ROOT / "examples").glob("*.yaml")]:
        named |= set(_formats(yaml.safe_load(matrix.read_text())))
    for fmt in named:
        row = next((line for line in PAGE.splitlines() if line.startswith(f"| `{fmt}` |")), None)
        assert row, f"data format {fmt} has no row in docs/licences.md"
    samsum = next(line for line in PAGE.splitlines() if line.startswith("| `samsum` |"))
    assert "CC BY-NC-ND 4.0" in samsum and "non-commercial" in samsum


def _formats(node):
    if isinstance(node, dict):
        if isinstance(node.get("format"), str) and "path" in node:
            yield node["format"]
        for value in node.values():
            yield from _formats(value)
    elif isinstance(node, list):
        for value in node:
            yield from _formats(value)
