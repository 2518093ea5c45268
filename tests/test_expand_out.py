"""Output under any --out reaches the repository's base/: inside the repository at another depth, and
outside it. Every kustomization's resources resolve, every Flux path names the generated folder, and
(slow) every generated kustomization builds with the real kustomize."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from matrix_support import GOOD
from support import REPO_ROOT, cli_run

from generators.core.gotools import tool
from generators.expand import main


def expand_to(tmp_path: Path, out: Path) -> Path:
    matrix = tmp_path / "m.yaml"
    matrix.write_text(GOOD)
    result = cli_run(main, [str(matrix), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def kustomizations(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.rglob("kustomization.yaml"))


@pytest.fixture(params=["outside", "deeper-inside"])
def out(request, tmp_path: Path) -> Path:
    if request.param == "outside":
        yield expand_to(tmp_path, tmp_path / "elsewhere" / "overlays")
        return
    # Inside the repository, two levels deeper than overlays/ (the ignored out/ folder, removed afterwards).
    target = REPO_ROOT / "out" / f"test-{tmp_path.name}" / "overlays"
    yield expand_to(tmp_path, target)
    shutil.rmtree(target.parent)


def test_every_resource_and_flux_path_resolves(out: Path):
    dirs = kustomizations(out)
    on_base = [d for d in dirs if d.parent.parent.name == "runs" or d.name in ("controllers", "configs")]
    assert len(on_base) == 4 + 2 * 2  # four runs; controllers and configs of two clusters
    for d in dirs:
        k = yaml.safe_load((d / "kustomization.yaml").read_text())
        for ref in k.get("resources", []):
            assert (d / ref).exists(), f"{d}: resource {ref} does not exist"
        if d in on_base:
            assert any((d / ref).resolve().is_relative_to(REPO_ROOT / "base") for ref in k["resources"])
    flux_paths = [
        doc["spec"]["path"]
        for f in (out / "clusters").rglob("*.yaml")
        for doc in yaml.safe_load_all(f.read_text())
        if doc and doc["kind"] == "Kustomization"
    ]
    generated = [p for p in flux_paths if not p.startswith("./base/")]
    assert len(generated) >= 4 + 2 * 2
    for path in generated:
        assert (REPO_ROOT / path).resolve().is_relative_to(out.resolve()), path
        assert (REPO_ROOT / path / "kustomization.yaml").is_file(), path


@pytest.mark.gotools
def test_every_generated_kustomization_builds_with_kustomize(out: Path):
    for d in kustomizations(out):
        proc = subprocess.run(
            [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(d)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"{d}: {proc.stderr}"
        assert "kind:" in proc.stdout
