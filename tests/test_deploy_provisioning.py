"""The cluster definitions a platform engineer expects beyond the node groups: the cluster autoscaler's
GPU label, EKS node repair on the GPU node groups, VPC endpoints for ECR and S3, and the export of the
shared volume's results to S3. Pure renderer output on the seed matrix and a small one."""

from __future__ import annotations

from typing import Any

import pytest
from matrix_support import cluster_plans
from support import REPO_ROOT

from generators.core.yamlio import load_documents
from generators.render import provisioning
from trainer.catalog import INSTANCE_TYPES

MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {url: https://github.com/example/fsdp-gitops, branch: main}
clusters:
  a: {region: us-west-2, availability_zones: [us-west-2a], instance_types: [p4de.24xlarge, p5.48xlarge, p5en.48xlarge]}
include:
  - cluster: a
    model: llama2-7b
    nodes: 2
    instance_type: p5.48xlarge
    trainer.data.path: /shared/data/samsum/train.jsonl
"""


@pytest.fixture(scope="module")
def files() -> dict[str, Any]:
    return provisioning.render(cluster_plans(MATRIX), karpenter=False)


def gpu_groups(files: dict[str, Any]) -> list[dict[str, Any]]:
    groups = files["a/eksctl.yaml"]["managedNodeGroups"]
    return [g for g in groups if g["instanceType"] in INSTANCE_TYPES]


def test_every_gpu_node_group_carries_the_autoscalers_gpu_label_as_label_and_scale_from_zero_tag(files):
    groups = gpu_groups(files)
    assert len(groups) == 3
    want = {"p4de.24xlarge": "nvidia-tesla-a100", "p5.48xlarge": "nvidia-h100", "p5en.48xlarge": "nvidia-h200"}
    for g in groups:
        assert g["labels"]["k8s.amazonaws.com/accelerator"] == want[g["instanceType"]]
        tag = "k8s.io/cluster-autoscaler/node-template/label/k8s.amazonaws.com/accelerator"
        assert g["tags"][tag] == want[g["instanceType"]], g["name"]
    system = [g for g in files["a/eksctl.yaml"]["managedNodeGroups"] if g["name"] == "system"]
    assert "k8s.amazonaws.com/accelerator" not in system[0]["labels"]


def test_gpu_node_groups_have_node_repair_one_node_at_a_time(files):
    for g in gpu_groups(files):
        repair = g["nodeRepairConfig"]
        assert repair["enabled"] is True and repair["maxParallelNodesRepairedCount"] == 1


def test_node_repair_comes_with_the_node_monitoring_agent_that_reports_gpu_faults(files):
    addons = [a["name"] for a in files["a/eksctl.yaml"]["addons"]]
    assert "eks-node-monitoring-agent" in addons
    assert all(g["nodeRepairConfig"]["enabled"] for g in gpu_groups(files))


def test_vpc_endpoints_template_covers_ecr_api_dkr_and_s3_in_the_private_subnets(files):
    cfn = files["a/vpc-endpoints.cfn.yaml"]
    services = {}
    for res in cfn["Resources"].values():
        assert res["Type"] == "AWS::EC2::VPCEndpoint"
        props = res["Properties"]
        services[props["ServiceName"]["Fn::Sub"][0].removeprefix("com.amazonaws.${Region}.")] = props
    assert set(services) == {"ecr.api", "ecr.dkr", "s3"}
    assert services["s3"]["VpcEndpointType"] == "Gateway" and services["s3"]["RouteTableIds"] == {
        "Ref": "PrivateRouteTableIds"
    }
    for name in ("ecr.api", "ecr.dkr"):
        assert services[name]["VpcEndpointType"] == "Interface" and services[name]["PrivateDnsEnabled"] is True
        assert services[name]["SubnetIds"] == {"Ref": "PrivateSubnetIds"}
    # Every Ref names a parameter or a pseudo parameter of the template.
    refs = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "Ref" in node:
                refs.add(node["Ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(cfn["Resources"])
    assert refs <= set(cfn["Parameters"]) | {"AWS::Region"}


def test_results_export_exports_checkpoints_runs_and_exports_on_every_change(files):
    cfn = files["a/results-export.cfn.yaml"]
    paths = {}
    for res in cfn["Resources"].values():
        assert res["Type"] == "AWS::FSx::DataRepositoryAssociation"
        props = res["Properties"]
        assert props["S3"]["AutoExportPolicy"]["Events"] == ["NEW", "CHANGED", "DELETED"]
        paths[props["FileSystemPath"]] = props["DataRepositoryPath"]["Fn::Sub"]
    # The planner's checkpoint and metrics roots (generators/plan) are under the exported folders.
    from generators.plan import CHECKPOINT_ROOT, RUNS_ROOT

    for root in (CHECKPOINT_ROOT, RUNS_ROOT):
        assert root.removeprefix("/shared") in paths
    assert paths["/exports"] == "${ExportPath}/exports"
    assert cfn["Parameters"]["ExportPath"]["Default"].startswith("s3://")


def test_the_committed_provisioning_files_carry_the_label_repair_and_templates():
    for eksctl in sorted((REPO_ROOT / "overlays" / "provisioning").glob("*/eksctl.yaml")):
        (doc,) = load_documents(eksctl.read_text(), str(eksctl))
        for g in doc.data["managedNodeGroups"]:
            if g["name"].startswith("gpu-"):
                assert "k8s.amazonaws.com/accelerator" in g["labels"] and g["nodeRepairConfig"]["enabled"]
        fix = "run python generators/cluster.py matrix.yaml"
        assert {"name": "eks-node-monitoring-agent"} in doc.data["addons"], fix
        for name in ("vpc-endpoints.cfn.yaml", "results-export.cfn.yaml"):
            assert (eksctl.parent / name).is_file(), f"run python generators/cluster.py matrix.yaml ({name})"


def test_prometheus_keeps_its_retention_on_a_volume_the_cluster_can_provision():
    path = REPO_ROOT / "base" / "monitoring" / "controllers" / "kube-prometheus-stack.yaml"
    (doc,) = load_documents(path.read_text(), str(path))
    spec = doc.data["spec"]["values"]["prometheus"]["prometheusSpec"]
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    size_gib = int(claim["resources"]["requests"]["storage"].removesuffix("Gi"))
    assert int(spec["retentionSize"].removesuffix("GB")) < size_gib, "retentionSize must stay below the volume"
    assert claim["storageClassName"] == "gp2"
    (eksctl,) = load_documents(provisioning_file("fsdp-p5").read_text(), "eksctl.yaml")
    assert {"name": "aws-ebs-csi-driver"} in eksctl.data["addons"], "the gp2 volume needs the EBS CSI driver"


def provisioning_file(cluster: str):
    return REPO_ROOT / "overlays" / "provisioning" / cluster / "eksctl.yaml"
