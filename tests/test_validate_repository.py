"""The committed repository passes the validation pipeline (what CI and tools/test.sh run)."""
from __future__ import annotations

from generators import validate as v


def test_the_repository_validates():
    report = v.validate(v.REPO_ROOT, crd_dir=v.default_crd_dir())
    assert [str(p) for p in report.problems] == []
    # Something was really checked: run overlays and bases were built, the Flux graph was walked.
    assert report.num_builds >= 10
    assert report.num_flux_kustomizations >= 3
