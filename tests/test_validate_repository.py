"""The committed repository passes the validation pipeline (what CI and tools/test.sh run)."""

from __future__ import annotations

import pytest
from support import REPO_ROOT

from generators.validation import pipeline, schemas

# kustomize and kubeconform over the whole repository.
pytestmark = pytest.mark.gotools


def test_the_repository_validates():
    report = pipeline.validate(REPO_ROOT, crd_dir=schemas.default_crd_dir())
    assert [str(p) for p in report.problems] == []
    # Something was really checked: every run overlay was built and its PyTorchJob checked, and the
    # Flux graph of each cluster was walked (infrastructure Kustomizations plus one per run).
    runs = [d for d in (REPO_ROOT / "overlays" / "runs").glob("*/*") if d.is_dir()]
    clusters = [d for d in (REPO_ROOT / "overlays" / "clusters").iterdir() if d.is_dir()]
    assert runs and clusters
    assert report.num_builds > len(runs)
    assert report.num_pytorchjobs >= len(runs)
    assert report.num_flux_kustomizations >= len(runs) + 2 * len(clusters)
