"""Rule: every extended resource a job requests is advertised where the job can run.

A small real tree (the mutation tests' runs, the repository's own base/device-plugins, an eksctl
node group tainted like the generated ones) goes through the real validation pipeline; then one
mistake at a time: the EFA plugin as eksctl installs it (tolerating only CriticalAddonsOnly and
aws.amazon.com/efa), a plugin pinned to other instance types, no NVIDIA plugin, a job that tolerates
no GPU node, and the Karpenter form of the nodes. The repository's own clusters pass (test at the end).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT
from validate_support import fixture_files as job_fixture
from validate_support import flux_kustomization, problems, write_tree

from generators.core.gotools import tool
from generators.core.yamlio import Doc
from generators.validation.device_plugins import Node, check_device_plugins, selects

PLUGINS = REPO_ROOT / "base" / "device-plugins"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
EKSCTL = {
    "apiVersion": "eksctl.io/v1alpha5",
    "kind": "ClusterConfig",
    "metadata": {"name": "c1", "region": "us-west-2"},
    "managedNodeGroups": [
        {
            "name": "gpu-p5-48xlarge",
            "instanceType": "p5.48xlarge",
            "labels": {"fsdp-gitops/node-role": "gpu"},
            "taints": [GPU_TAINT],
        }
    ],
}
NODEPOOL = {
    "apiVersion": "karpenter.sh/v1",
    "kind": "NodePool",
    "metadata": {"name": "gpu-p5-48xlarge"},
    "spec": {
        "template": {
            "metadata": {"labels": {"fsdp-gitops/node-role": "gpu"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}
                ],
                "taints": [GPU_TAINT],
            },
        }
    },
}


def fixture_files() -> dict[str, Any]:
    files = job_fixture()
    spec = files["base/pytorchjob/pytorchjob.yaml"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # As base/pytorchjob: the image's non-root user.
    spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}
    for f in sorted(PLUGINS.glob("*.yaml")):
        files[f"base/device-plugins/{f.name}"] = f.read_text()
    files["overlays/infrastructure/c1/controllers/kustomization.yaml"] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../../../base/device-plugins"],
    }
    files["overlays/clusters/c1/infrastructure.yaml"] = [
        flux_kustomization("infra-controllers", "./overlays/infrastructure/c1/controllers"),
        flux_kustomization("infra-configs", "./overlays/infrastructure/c1/configs", ["infra-controllers"]),
    ]
    files["overlays/provisioning/c1/eksctl.yaml"] = EKSCTL
    return files


def run(tmp_path: Path, change: Callable[[dict[str, Any]], None] = lambda files: None) -> list[str]:
    files = fixture_files()
    change(files)
    write_tree(tmp_path, files)
    return problems(tmp_path)


def plugin_problems(found: list[str]) -> list[str]:
    return [p for p in found if "device plugin" in p or "selects no node" in p]


def edit_plugin(name: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def change(files: dict[str, Any]) -> None:
        doc = yaml.safe_load(files[f"base/device-plugins/{name}"])
        edit(doc["spec"]["template"]["spec"])
        files[f"base/device-plugins/{name}"] = doc

    return change


@pytest.mark.gotools
def test_clean_tree_passes(tmp_path):
    assert run(tmp_path) == []


@pytest.mark.gotools
def test_the_efa_plugin_as_eksctl_installs_it_leaves_efa_unadvertised(tmp_path):
    def eksctl_tolerations(pod: dict[str, Any]) -> None:
        pod["tolerations"] = [
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"key": "aws.amazon.com/efa", "operator": "Exists", "effect": "NoSchedule"},
        ]

    found = plugin_problems(run(tmp_path, edit_plugin("efa-device-plugin.yaml", eksctl_tolerations)))
    assert found and all("requests vpc.amazonaws.com/efa" in p for p in found), found
    assert "DaemonSet/device-plugins/efa-device-plugin does not tolerate its taints" in found[0]
    assert "node group gpu-p5-48xlarge" in found[0] and found[0].startswith("overlays/runs/c1/run-")


@pytest.mark.gotools
def test_a_plugin_pinned_to_other_instance_types_leaves_the_gpus_unadvertised(tmp_path):
    def other_types(pod: dict[str, Any]) -> None:
        expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][
            0
        ]["matchExpressions"][0]
        expr["values"] = ["p4de.24xlarge"]

    found = plugin_problems(run(tmp_path, edit_plugin("nvidia-device-plugin.yaml", other_types)))
    assert len(found) == 2 and all("requests nvidia.com/gpu" in p for p in found), found


@pytest.mark.gotools
def test_without_a_plugin_nothing_advertises_the_resource(tmp_path):
    def drop_nvidia(files: dict[str, Any]) -> None:
        kust = yaml.safe_load(files["base/device-plugins/kustomization.yaml"])
        kust["resources"].remove("nvidia-device-plugin.yaml")
        files["base/device-plugins/kustomization.yaml"] = kust

    found = plugin_problems(run(tmp_path, drop_nvidia))
    assert len(found) == 2 and all("requests nvidia.com/gpu" in p and "none advertises it" in p for p in found)


@pytest.mark.gotools
def test_a_job_that_tolerates_no_gpu_node_selects_none(tmp_path):
    def no_toleration(files: dict[str, Any]) -> None:
        files["base/pytorchjob/pytorchjob.yaml"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].pop(
            "tolerations"
        )

    found = plugin_problems(run(tmp_path, no_toleration))
    assert len(found) == 2 and all("selects no node of cluster c1" in p for p in found), found


@pytest.mark.gotools
def test_karpenter_nodepools_are_the_nodes_when_they_are_the_provisioning(tmp_path):
    def karpenter(files: dict[str, Any]) -> None:
        del files["overlays/provisioning/c1/eksctl.yaml"]
        pool = yaml.safe_load(yaml.safe_dump(NODEPOOL))
        pool["spec"]["template"]["spec"]["taints"].append(
            {"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NoExecute"}
        )
        files["overlays/provisioning/c1/karpenter/nodepool.yaml"] = pool

    def job_tolerates_efa(files: dict[str, Any]) -> None:
        karpenter(files)
        spec = files["base/pytorchjob/pytorchjob.yaml"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        spec["tolerations"].append({"key": "vpc.amazonaws.com/efa", "operator": "Exists"})

    # The plugins tolerate vpc.amazonaws.com/efa only with effect NoSchedule: not the NoExecute taint.
    found = plugin_problems(run(tmp_path, job_tolerates_efa))
    assert {p.split("requests ")[1].split(",")[0] for p in found} == {"nvidia.com/gpu", "vpc.amazonaws.com/efa"}
    assert all("NodePool gpu-p5-48xlarge" in p for p in found), found


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU_TAINT, True),
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, GPU_TAINT, True),
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "false"}, GPU_TAINT, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, GPU_TAINT, False),
        ({"operator": "Exists"}, GPU_TAINT, True),
        ({"key": "CriticalAddonsOnly", "operator": "Exists"}, GPU_TAINT, False),
    ],
)
def test_taint_toleration_matching_follows_the_scheduler(toleration, taint, expected):
    node = Node("n", {"node.kubernetes.io/instance-type": "p5.48xlarge"}, (taint,))
    assert selects({"tolerations": [toleration]}, node) is expected


def test_prefer_no_schedule_taints_do_not_keep_pods_away():
    node = Node("n", {}, ({"key": "x", "effect": "PreferNoSchedule"},))
    assert selects({}, node)


@pytest.mark.gotools
def test_the_repository_clusters_advertise_every_resource_their_runs_request():
    """The committed overlays: each cluster's runs against its controllers and its eksctl node groups."""

    def build(path: Path) -> list[Doc]:
        out = subprocess.run(
            [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [Doc(d, str(path.relative_to(REPO_ROOT))) for d in yaml.safe_load_all(out) if d]

    overlays = REPO_ROOT / "overlays"
    clusters = sorted(p.name for p in (overlays / "runs").iterdir())
    assert clusters
    for cluster in clusters:
        runs = sorted((overlays / "runs" / cluster).iterdir())[:2]
        units = [(str(r.relative_to(REPO_ROOT)), build(r)) for r in runs]
        controllers = overlays / "infrastructure" / cluster / "controllers"
        units.append((str(controllers.relative_to(REPO_ROOT)), build(controllers)))
        prov = {
            str(f.relative_to(REPO_ROOT)): [
                Doc(d, str(f.relative_to(REPO_ROOT))) for d in yaml.safe_load_all(f.read_text()) if d
            ]
            for f in sorted((overlays / "provisioning" / cluster).rglob("*.yaml"))
        }
        assert prov, cluster
        assert check_device_plugins(units, prov) == [], cluster
