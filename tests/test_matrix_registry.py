"""Each cluster pulls the trainer image from a registry of its own region (or the one it names): a
multi-GB image is never pulled across regions. From the user's side: the real generator writes the
overlays and real kustomize builds them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from matrix_support import GOOD, line_of, snapshot

from generators.core.gotools import tool
from generators.expand import main as expand_main
from generators.matrix.schema import DEFAULT_IMAGE

EU = "111122223333.dkr.ecr.eu-west-1.amazonaws.com"
MIXED = "  fsdp-mixed:\n    region: us-east-1\n    availability_zones: [us-east-1a]\n"
# fsdp-mixed moved to eu-west-1 and given the runs.
IN_EU = GOOD.replace(MIXED, "  fsdp-mixed:\n    region: eu-west-1\n    availability_zones: [eu-west-1a]\n").replace(
    "  cluster: fsdp-p5\n", "  cluster: fsdp-mixed\n  instance_type: p5en.48xlarge\n"
)


def expand(tmp_path: Path, text: str, cli) -> Path:
    (tmp_path / "m.yaml").write_text(text)
    out = tmp_path / "out"
    result = cli(expand_main, [str(tmp_path / "m.yaml"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def built_images(out: Path, path: str) -> set[str]:
    text = subprocess.run(
        [tool("kustomize"), "build", str(out / path)], check=True, capture_output=True, text=True
    ).stdout
    images: set[str] = set()
    for doc in yaml.safe_load_all(text):
        spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        images.update(c["image"] for c in spec.get("containers", []) + spec.get("initContainers", []))
        for replica in ((doc or {}).get("spec") or {}).get("pytorchReplicaSpecs", {}).values():
            images.update(c["image"] for c in replica["template"]["spec"]["containers"])
    return images


@pytest.mark.gotools
def test_a_cluster_in_another_region_pulls_every_trainer_image_from_that_region(tmp_path: Path, cli) -> None:
    out = expand(tmp_path, IN_EU, cli)
    tag = DEFAULT_IMAGE.rsplit(":", 1)[1]
    trainer = f"{EU}/fsdp-gitops/trainer:{tag}"
    runs = sorted((out / "runs" / "fsdp-mixed").iterdir())
    assert runs
    for run in runs:
        assert trainer in built_images(out, str(run.relative_to(out))), run
    # The pre-flight and staging Jobs of base/ too, keeping the base's tag (which image automation moves).
    for part in ("configs", "data"):
        images = {i for i in built_images(out, f"infrastructure/fsdp-mixed/{part}") if "fsdp-gitops/trainer" in i}
        assert images == {trainer}, (part, images)
    # A cluster in the default image's region is unchanged.
    assert "images" not in yaml.safe_load(
        (out / "infrastructure/fsdp-p5/configs/preflight-p5/kustomization.yaml").read_text()
    )


@pytest.mark.gotools
def test_a_cluster_registry_moves_every_trainer_image_to_it(tmp_path: Path, cli) -> None:
    mirror = "registry.internal.example:5000"
    text = IN_EU.replace("    region: eu-west-1\n", f"    region: eu-west-1\n    registry: {mirror}\n")
    text = text.replace(
        "  cluster: fsdp-mixed\n", "  cluster: fsdp-mixed\n  image: ghcr.io/example-org/trainer:1.2.0\n"
    )
    out = expand(tmp_path, text, cli)
    (run,) = [r for r in (out / "runs" / "fsdp-mixed").iterdir() if "llama2-7b" in r.name and "-n1-" in r.name]
    assert f"{mirror}/example-org/trainer:1.2.0" in built_images(out, str(run.relative_to(out)))
    images = {i for i in built_images(out, "infrastructure/fsdp-mixed/configs") if "trainer" in i}
    assert images == {f"{mirror}/fsdp-gitops/trainer:{DEFAULT_IMAGE.rsplit(':', 1)[1]}"}, images


@pytest.mark.parametrize("registry", ["https://mirror.example", "mirror.example/trainer", "mirror"])
def test_a_registry_that_is_not_a_host_is_one_line_and_nothing_is_written(tmp_path: Path, cli, registry: str) -> None:
    out = expand(tmp_path, GOOD, cli)
    before = snapshot(out)
    text = GOOD.replace("    region: us-east-1\n", f"    region: us-east-1\n    registry: {registry}\n")
    (tmp_path / "m.yaml").write_text(text)
    result = cli(expand_main, [str(tmp_path / "m.yaml"), "--out", str(out)])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.output
    assert result.stderr.startswith(f"error: {tmp_path / 'm.yaml'}:{line_of(text, 'registry:')}: ") or (
        f"m.yaml:{line_of(text, 'registry:')}: clusters.fsdp-mixed.registry: " in result.stderr
    ), result.stderr
    assert "fix: write the host alone" in result.stderr
    assert snapshot(out) == before
