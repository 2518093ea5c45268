"""GPU nodes' root volumes are provisioned for image pulls (every run scales its nodes from zero and
pulls a multi-GB image), and the plan's start-up time follows what they are provisioned with."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from matrix_support import GOOD

from generators.core.gotools import REPO_ROOT
from generators.expand import main as expand_main
from generators.plan import overheads


def test_every_gpu_node_group_has_the_root_volume_the_plan_assumes() -> None:
    groups = []
    for path in sorted((REPO_ROOT / "overlays" / "provisioning").glob("*/eksctl.yaml")):
        config = yaml.safe_load(path.read_text())
        groups += [g for g in config["managedNodeGroups"] if g["labels"].get("fsdp-gitops/node-role") == "gpu"]
    assert groups
    for g in groups:
        assert g["volumeType"] == "gp3", g["name"]
        assert g["volumeThroughput"] == overheads.GPU_ROOT_VOLUME_MIB_S, g["name"]
        assert g["volumeIOPS"] == overheads.GPU_ROOT_VOLUME_IOPS, g["name"]
        # gp3's limits: 1,000 MiB/s, 16,000 IOPS, and at most 0.25 MiB/s per IOPS.
        assert g["volumeThroughput"] <= min(1000, g["volumeIOPS"] / 4) and g["volumeIOPS"] <= 16000


def test_the_plans_start_is_the_pull_at_the_slower_of_the_registry_and_the_root_volume(tmp_path: Path, cli) -> None:
    at_default = overheads.image_pull_s(overheads.GP3_DEFAULT_MIB_S)
    provisioned = overheads.image_pull_s()
    # At gp3's default the volume, not the registry, bounds the pull; provisioned, the registry does.
    assert at_default > overheads.IMAGE_GB / overheads.IMAGE_PULL_GB_S == provisioned
    # The plan a user reads says so: every run's start.
    matrix = tmp_path / "m.yaml"
    matrix.write_text(  # room on the shared volume for every run's checkpoints
        GOOD.replace(
            "    instance_types: [p5.48xlarge]\n", "    instance_types: [p5.48xlarge]\n    shared_storage_gib: 4800\n"
        )
    )
    result = cli(expand_main, [str(matrix), "--plan", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    runs = [r for r in rows if "run" in r]
    assert runs and all(r["start_min"] == round((overheads.POD_START_S + provisioned) / 60, 1) for r in runs), runs
