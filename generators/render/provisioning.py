"""The EKS cluster definitions (eksctl, optionally Karpenter) of each cluster plan: pure, no I/O.

generators/cluster.py writes them. Then, per cluster:
`eksctl create cluster -f overlays/provisioning/<cluster>/eksctl.yaml` (and with --karpenter,
`kubectl apply -f overlays/provisioning/<cluster>/karpenter/` once Karpenter runs).
These files create the cluster Flux is bootstrapped into, so they sit outside the Flux path.

What each cluster of the matrix gets (overlays/provisioning/<cluster>/eksctl.yaml, eksctl.io/v1alpha5):
- the cluster in the matrix's region and Kubernetes version; its VPC spans the matrix's zones, plus
  the region's next zone letter when the matrix names only one (EKS needs subnets in two zones);
- the way to create it, in the annotation fsdp-gitops/create-with: without eksctl's own device
  plugins (its EFA plugin does not tolerate the GPU taint; base/device-plugins brings both);
- add-ons: the EKS defaults (the VPC CNI with its NetworkPolicy agent on, which base/etcd's policy
  needs), the Pod Identity agent, and the FSx for Lustre CSI driver that the shared volume
  (StorageClass fsx-sc, generators/render/flux.py) needs; Pod Identities for Flux's
  image-reflector-controller to read ECR (base/image-automation/imagerepository.yaml, provider aws)
  and for the cluster autoscaler (base/cluster-autoscaler, eksctl's autoScaler policy);
- a `system` managed node group (SYSTEM_NODES) for Flux, the Training Operator, etcd and monitoring;
- one GPU managed node group per instance type of the cluster, in the first zone of the matrix (the
  zone of the capacity reservation; EFA traffic stays in one zone): EFA enabled, private subnets only,
  the matrix's root volume size, tainted nvidia.com/gpu=true:NoSchedule (the PyTorchJobs and GPU
  DaemonSets tolerate it), minSize 0 and desiredCapacity 0 (GPU nodes cost money while idle: the
  cluster autoscaler of base/cluster-autoscaler scales the groups tagged for its auto-discovery, with
  the scale-from-zero tags for resources, the node-role label and the taint), and
  maxSize = the most nodes any run of that instance type on that cluster asks for (1 when no run uses
  it yet). A capacity reservation id of the matrix targets the node group; eksctl takes one
  reservation per node group and the matrix does not say which type an id reserves, so this needs a
  cluster with one instance type and one id (Karpenter has neither limit). With `capacity_blocks`
  the id is a Capacity Block for ML and the group launches with market type capacity-block (Karpenter
  finds Capacity Blocks through the same capacityReservationSelectorTerms, capacity type reserved).
  Each GPU node group also carries the cluster autoscaler's GPU label (ACCELERATOR_LABEL, as a node
  label and as a scale-from-zero tag), so the autoscaler counts a new node's GPUs as coming while the
  device plugin starts instead of starting more nodes, and EKS node auto repair (NODE_REPAIR).
With --karpenter the GPU node groups are left out; eksctl installs Karpenter (KARPENTER_VERSION) and
overlays/provisioning/<cluster>/karpenter/ holds one EC2NodeClass (AL2023 NVIDIA AMI, private subnets
and security groups found by the karpenter.sh/discovery tag, the root volume, every capacity
reservation of the cluster) and one NodePool per instance type (zone, taint, a GPU limit of
max_nodes nodes, consolidation only when empty so no running job is disrupted). Pods that request
vpc.amazonaws.com/efa make Karpenter attach EFA interfaces.

Two CloudFormation templates per cluster, for what eksctl cannot express (render_vpc_endpoints,
render_results_export); both are deployed with `aws cloudformation deploy` (docs/deploy-eks.md):
- vpc-endpoints.cfn.yaml: VPC endpoints for ECR (api, dkr; interface) and S3 (gateway), so image pulls
  (ECR serves layers from S3) and S3 traffic of the nodes stay off the NAT gateway. eksctl creates VPC
  endpoints only for a fully private cluster (`privateCluster.enabled`, which also takes the API
  server's public endpoint away); its schema has no field for endpoints in a cluster with a NAT
  gateway (eksctl v0.230.0 ClusterVPC: no endpoints field).
- results-export.cfn.yaml: FSx for Lustre data repository associations that export the shared
  volume's checkpoints/, runs/ and exports/ to S3 as files are written (NEW, CHANGED, DELETED
  events), so the final checkpoint, the metrics and the Hugging Face export outlive the file system.
  The file system id exists only once the shared volume is bound (dynamic provisioning), hence a
  template with parameters rather than a field of the eksctl file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from generators.core.errors import InputError
from generators.matrix.schema import Cluster
from generators.plan import ClusterPlan
from generators.plan.overheads import GPU_ROOT_VOLUME_IOPS, GPU_ROOT_VOLUME_MIB_S
from trainer.catalog import INSTANCE_TYPES

EKSCTL_API = "eksctl.io/v1alpha5"
KARPENTER_API = "karpenter.sh/v1"
KARPENTER_AWS_API = "karpenter.k8s.aws/v1"
# Karpenter release eksctl installs with --karpenter; the same release as the NodePool/EC2NodeClass
# schemas CI validates against (datreeio/CRDs-catalog "karpenter CRDs v1.14.0").
KARPENTER_VERSION = "1.14.0"
# EKS-optimized Amazon Linux 2023; eksctl and Karpenter pick its NVIDIA variant for GPU instances.
# The Karpenter alias pins the AMI release (an awslabs/amazon-eks-ami release tag) its nodes boot.
AMI_FAMILY = "AmazonLinux2023"
KARPENTER_AMI_ALIAS = "al2023@v20260818"
# Controllers (Flux, Training Operator, etcd, kube-prometheus-stack with Grafana, Karpenter) fit on two
# 8 vCPU / 32 GiB nodes with room for one to drain; they never run on GPU nodes.
SYSTEM_NODES = {
    "name": "system",
    "instanceType": "m6i.2xlarge",
    "minSize": 2,
    "desiredCapacity": 2,
    "maxSize": 4,
    "volumeSize": 100,
}
NODE_ROLE_LABEL = "fsdp-gitops/node-role"
# The cluster autoscaler's GPU label on AWS (cluster-autoscaler/cloudprovider/aws/aws_cloud_provider.go,
# GPULabel). utils/gpu NodeHasGpu treats a node carrying the key as a GPU node whatever the value, so
# a new node whose device plugin has not yet reported nvidia.com/gpu counts as "GPUs coming" and the
# autoscaler does not start more nodes for the same pending pods. The value names the GPU the way the
# AWS provider's availableGPUTypes does (nvidia-tesla-a100); that list has no H100/H200 entry, which
# only affects the GPU-type metric label (unknown), not the scale-up decision.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
ACCELERATOR_VALUES = {"A100": "nvidia-tesla-a100", "H100": "nvidia-h100", "H200": "nvidia-h200"}
# EKS node auto repair for the GPU node groups (eksctl ManagedNodeGroup.nodeRepairConfig): the node
# monitoring agent reports GPU and network faults as node conditions, EKS replaces the node. At most one
# GPU node is repaired at a time, and repairs stop when half of a group is unhealthy (then something
# bigger is wrong, and replacing nodes would only cost the running jobs; docs/operations.md runbook).
NODE_REPAIR = {"enabled": True, "maxParallelNodesRepairedCount": 1, "maxUnhealthyNodeThresholdPercentage": 50}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
CLUSTER_TAG = "fsdp-gitops/cluster"
DISCOVERY_TAG = "karpenter.sh/discovery"
# Flux's image-reflector-controller reads tags from ECR with this identity (provider: aws).
ECR_READ_POLICY = "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"
# Cluster-autoscaler (base/cluster-autoscaler) scales the Auto Scaling groups tagged with the first
# two tags (auto-discovery), and reads the node-template tags to scale a group up from zero nodes.
AUTOSCALER_ENABLED_TAG = "k8s.io/cluster-autoscaler/enabled"
AUTOSCALER_CLUSTER_TAG = "k8s.io/cluster-autoscaler/"
AUTOSCALER_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
AUTOSCALER_LABEL_TAG = "k8s.io/cluster-autoscaler/node-template/label/"
AUTOSCALER_TAINT_TAG = "k8s.io/cluster-autoscaler/node-template/taint/"
# The ServiceAccount of base/cluster-autoscaler; eksctl gives it eksctl's autoScaler policy.
AUTOSCALER_SERVICE_ACCOUNT = ("kube-system", "cluster-autoscaler")
# How the cluster must be created. eksctl installs its own NVIDIA and EFA device plugins unless told
# not to (no config field exists for that, only flags); its EFA plugin ignores the GPU taint. The
# pinned plugins of base/device-plugins replace both.
CREATE_WITH = (
    "eksctl create cluster -f overlays/provisioning/{cluster}/eksctl.yaml --install-nvidia-plugin=false; "
    "then kubectl -n kube-system delete daemonset aws-efa-k8s-device-plugin-daemonset: the device "
    "plugins come from base/device-plugins through Flux"
)
# The VPC CNI enforces NetworkPolicy (base/etcd/networkpolicy.yaml) only with its policy agent on.
VPC_CNI_CONFIG = '{"enableNetworkPolicy":"true"}'
# The EKS add-ons beside the VPC CNI. Node auto repair (NODE_REPAIR) acts on the node conditions
# that the node monitoring agent reports (GPU XID errors, NVLink, EFA, kubelet and containerd
# faults): without the agent a faulty GPU node is never repaired. The EBS CSI driver provisions
# Prometheus's volume (base/monitoring/controllers, StorageClass gp2).
ADDONS = (
    "coredns",
    "kube-proxy",
    "eks-pod-identity-agent",
    "aws-fsx-csi-driver",
    "aws-ebs-csi-driver",
    "eks-node-monitoring-agent",
)


def nodegroup_name(instance_type: str) -> str:
    """'p5.48xlarge' -> 'gpu-p5-48xlarge' (node group and NodePool name)."""
    return "gpu-" + instance_type.replace(".", "-")


def cluster_zones(cluster: Cluster) -> list[str]:
    """The VPC's zones: the matrix's, plus the next zone letter of the region when it names one."""
    zones = list(cluster.availability_zones)
    if len(zones) == 1:
        letter = zones[0][-1]
        zones.append(zones[0][:-1] + chr(ord(letter) + 1 if letter != "z" else ord("a")))
    return zones


def max_nodes_by_type(plan: ClusterPlan) -> dict[str, int]:
    """Instance type -> the most nodes one run of this cluster asks for (1 when no run uses it)."""
    most = {itype: 1 for itype in plan.cluster.instance_types}
    for p in plan.runs:
        most[p.instance_type] = max(most.get(p.instance_type, 1), p.nodes)
    return most


def accelerator_value(gpu_model: str) -> str:
    """The ACCELERATOR_LABEL value of a GPU model ("H100" -> "nvidia-h100")."""
    return ACCELERATOR_VALUES.get(gpu_model, "nvidia-" + gpu_model.lower())


def gpu_nodegroup(cluster: Cluster, instance_type: str, max_size: int) -> dict[str, Any]:
    itype = INSTANCE_TYPES[instance_type]
    group: dict[str, Any] = {
        "name": nodegroup_name(instance_type),
        "instanceType": instance_type,
        "amiFamily": AMI_FAMILY,
        "availabilityZones": [cluster.availability_zones[0]],
        "minSize": 0,
        "desiredCapacity": 0,
        "maxSize": max_size,
        "volumeSize": cluster.volume_size_gib,
        "volumeType": "gp3",
        # Provisioned for image pulls: every run scales its nodes from zero and pulls a multi-GB image,
        # which gp3's default 125 MiB/s writes slower than ECR serves it (the plan's start follows this).
        "volumeThroughput": GPU_ROOT_VOLUME_MIB_S,
        "volumeIOPS": GPU_ROOT_VOLUME_IOPS,
        "privateNetworking": True,
        "efaEnabled": True,
        "labels": {NODE_ROLE_LABEL: "gpu", ACCELERATOR_LABEL: accelerator_value(itype.gpu_model)},
        "taints": [dict(GPU_TAINT)],
        "nodeRepairConfig": dict(NODE_REPAIR),
        "propagateASGTags": True,
        "tags": {
            AUTOSCALER_ENABLED_TAG: "true",
            AUTOSCALER_CLUSTER_TAG + cluster.name: "owned",
            AUTOSCALER_RESOURCE_TAG + "nvidia.com/gpu": str(itype.num_gpus),
            AUTOSCALER_RESOURCE_TAG + "vpc.amazonaws.com/efa": str(itype.num_efa),
            AUTOSCALER_LABEL_TAG + NODE_ROLE_LABEL: "gpu",
            AUTOSCALER_LABEL_TAG + ACCELERATOR_LABEL: accelerator_value(itype.gpu_model),
            AUTOSCALER_TAINT_TAG + GPU_TAINT["key"]: f"{GPU_TAINT['value']}:{GPU_TAINT['effect']}",
        },
    }
    if cluster.capacity_reservation_ids:
        group["capacityReservation"] = {
            "capacityReservationTarget": {"capacityReservationID": cluster.capacity_reservation_ids[0]},
        }
        if cluster.capacity_blocks:
            # A Capacity Block launches only with this market type (and only inside its time window).
            group["instanceMarketOptions"] = {"marketType": "capacity-block"}
    return group


def render_eksctl(plan: ClusterPlan, karpenter: bool) -> dict[str, Any]:
    """The eksctl ClusterConfig of one cluster."""
    cluster = plan.cluster
    tags = {CLUSTER_TAG: cluster.name}
    if karpenter:
        # eksctl tags the VPC's subnets and security groups with the cluster's tags; the
        # EC2NodeClass selects them by this one.
        tags[DISCOVERY_TAG] = cluster.name
    system = {**SYSTEM_NODES, "amiFamily": AMI_FAMILY, "privateNetworking": True, "labels": {NODE_ROLE_LABEL: "system"}}
    config: dict[str, Any] = {
        "apiVersion": EKSCTL_API,
        "kind": "ClusterConfig",
        "metadata": {
            "name": cluster.name,
            "region": cluster.region,
            "version": cluster.kubernetes_version,
            "tags": tags,
            "annotations": {"fsdp-gitops/create-with": CREATE_WITH.format(cluster=cluster.name)},
        },
        "availabilityZones": cluster_zones(cluster),
        "vpc": {"nat": {"gateway": "Single"}},
        "iam": {
            "withOIDC": True,
            "podIdentityAssociations": [
                {
                    "namespace": "flux-system",
                    "serviceAccountName": "image-reflector-controller",
                    "permissionPolicyARNs": [ECR_READ_POLICY],
                },
                {
                    # In the Karpenter form no Auto Scaling group carries its tags and it stays idle.
                    "namespace": AUTOSCALER_SERVICE_ACCOUNT[0],
                    "serviceAccountName": AUTOSCALER_SERVICE_ACCOUNT[1],
                    "wellKnownPolicies": {"autoScaler": True},
                },
            ],
        },
        "addonsConfig": {"autoApplyPodIdentityAssociations": True},
        "addons": [{"name": "vpc-cni", "configurationValues": VPC_CNI_CONFIG}] + [{"name": name} for name in ADDONS],
        "managedNodeGroups": [system],
    }
    if karpenter:
        config["karpenter"] = {"version": KARPENTER_VERSION, "createServiceAccount": True}
    else:
        most = max_nodes_by_type(plan)
        config["managedNodeGroups"] += [gpu_nodegroup(cluster, t, most[t]) for t in cluster.instance_types]
    return config


def render_karpenter(cluster: Cluster) -> dict[str, Any]:
    """{file name: manifest} of the Karpenter objects of one cluster."""
    discovery = {DISCOVERY_TAG: cluster.name}
    spec: dict[str, Any] = {
        "amiSelectorTerms": [{"alias": KARPENTER_AMI_ALIAS}],
        # The node role eksctl creates when it installs Karpenter.
        "role": f"eksctl-KarpenterNodeRole-{cluster.name}",
        # Private subnets only (eksctl marks them with the internal-elb role tag).
        "subnetSelectorTerms": [{"tags": {**discovery, "kubernetes.io/role/internal-elb": "1"}}],
        "securityGroupSelectorTerms": [{"tags": discovery}],
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvda",
                "ebs": {
                    "volumeSize": f"{cluster.volume_size_gib}Gi",
                    "volumeType": "gp3",
                    "encrypted": True,
                    "deleteOnTermination": True,
                },
            }
        ],
        "tags": {CLUSTER_TAG: cluster.name},
    }
    if cluster.capacity_reservation_ids:
        spec["capacityReservationSelectorTerms"] = [{"id": cr} for cr in cluster.capacity_reservation_ids]
    files: dict[str, Any] = {
        "ec2nodeclass.yaml": {
            "apiVersion": KARPENTER_AWS_API,
            "kind": "EC2NodeClass",
            "metadata": {"name": "gpu"},
            "spec": spec,
        },
    }
    capacity_types = ["on-demand"] + (["reserved"] if cluster.capacity_reservation_ids else [])
    for instance_type in cluster.instance_types:
        itype = INSTANCE_TYPES[instance_type]
        files[f"nodepool-{nodegroup_name(instance_type)}.yaml"] = {
            "apiVersion": KARPENTER_API,
            "kind": "NodePool",
            "metadata": {"name": nodegroup_name(instance_type)},
            "spec": {
                "template": {
                    "metadata": {"labels": {NODE_ROLE_LABEL: "gpu"}},
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                        "requirements": [
                            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [instance_type]},
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": [cluster.availability_zones[0]],
                            },
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity_types},
                        ],
                        "taints": [dict(GPU_TAINT)],
                    },
                },
                # At most max_nodes nodes of this type at once.
                "limits": {"nvidia.com/gpu": str(itype.num_gpus * cluster.max_nodes)},
                # Never move a running job: a node goes only once it is empty.
                "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
            },
        }
    return files


CFN_VERSION = "2010-09-09"
# The shared volume's folders that reach S3 (generators/plan: checkpoints/<run>, runs/<run>; exports/ is
# where a run's trainer.checkpoint.export_dir should point for its Hugging Face export to be kept).
EXPORTED_FOLDERS = ("checkpoints", "runs", "exports")


def _param(kind: str, description: str) -> dict[str, str]:
    return {"Type": kind, "Description": description}


def render_vpc_endpoints(cluster: Cluster) -> dict[str, Any]:
    """CloudFormation: ECR (api, dkr) interface endpoints and the S3 gateway endpoint in the cluster's VPC.

    Interface endpoints with private DNS answer ecr.<region>.amazonaws.com and *.dkr.ecr... inside the
    VPC; ECR serves image layers from S3, which the gateway endpoint routes through the private route
    tables (AWS: "Amazon ECR interface VPC endpoints (AWS PrivateLink)", which asks for the S3 gateway
    endpoint for the layers). The nodes' security group must admit HTTPS from itself.
    """
    region = {"Ref": "AWS::Region"}

    def interface(service: str) -> dict[str, Any]:
        return {
            "Type": "AWS::EC2::VPCEndpoint",
            "Properties": {
                "VpcEndpointType": "Interface",
                "ServiceName": {"Fn::Sub": [f"com.amazonaws.${{Region}}.{service}", {"Region": region}]},
                "VpcId": {"Ref": "VpcId"},
                "SubnetIds": {"Ref": "PrivateSubnetIds"},
                "SecurityGroupIds": [{"Ref": "SecurityGroupId"}],
                "PrivateDnsEnabled": True,
            },
        }

    return {
        "AWSTemplateFormatVersion": CFN_VERSION,
        "Description": f"VPC endpoints of EKS cluster {cluster.name}: ECR api and dkr, S3 (fsdp-gitops)",
        "Parameters": {
            "VpcId": _param("AWS::EC2::VPC::Id", f"the VPC eksctl created for {cluster.name}"),
            "PrivateSubnetIds": _param("List<AWS::EC2::Subnet::Id>", "the cluster's private subnets"),
            "PrivateRouteTableIds": _param("CommaDelimitedList", "the route tables of the private subnets"),
            "SecurityGroupId": _param("AWS::EC2::SecurityGroup::Id", "the cluster security group (HTTPS from itself)"),
        },
        "Resources": {
            "EcrApiEndpoint": interface("ecr.api"),
            "EcrDkrEndpoint": interface("ecr.dkr"),
            "S3GatewayEndpoint": {
                "Type": "AWS::EC2::VPCEndpoint",
                "Properties": {
                    "VpcEndpointType": "Gateway",
                    "ServiceName": {"Fn::Sub": ["com.amazonaws.${Region}.s3", {"Region": region}]},
                    "VpcId": {"Ref": "VpcId"},
                    "RouteTableIds": {"Ref": "PrivateRouteTableIds"},
                },
            },
        },
    }


def render_results_export(cluster: Cluster) -> dict[str, Any]:
    """CloudFormation: one FSx data repository association per EXPORTED_FOLDERS entry of the shared volume.

    Automatic export (AutoExportPolicy NEW, CHANGED, DELETED) copies each file to S3 once it is closed,
    so a finished run's final checkpoint and Hugging Face export are in S3 without a copy step, and
    checkpoints the trainer rotates away go from S3 as well. Data repository associations exist for
    FSx for Lustre PERSISTENT_2 file systems (the StorageClass's deploymentType, docs/deploy-eks.md).
    """
    resources: dict[str, Any] = {}
    for folder in EXPORTED_FOLDERS:
        resources[f"Export{folder.capitalize()}"] = {
            "Type": "AWS::FSx::DataRepositoryAssociation",
            "Properties": {
                "FileSystemId": {"Ref": "FileSystemId"},
                "FileSystemPath": f"/{folder}",
                "DataRepositoryPath": {"Fn::Sub": f"${{ExportPath}}/{folder}"},
                "BatchImportMetaDataOnCreate": False,
                "S3": {"AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
            },
        }
    return {
        "AWSTemplateFormatVersion": CFN_VERSION,
        "Description": f"S3 export of the shared volume of EKS cluster {cluster.name} (fsdp-gitops)",
        "Parameters": {
            "FileSystemId": _param("String", "the FSx file system of PVC fsdp-shared (the PV's volumeHandle, fs-...)"),
            "ExportPath": {
                "Type": "String",
                "Description": "where the results go, without a trailing slash",
                "AllowedPattern": "^s3://[a-z0-9.-]+(/[^/]+)*$",
                "Default": f"s3://fsdp-gitops-results-{cluster.name}/{cluster.name}",
            },
        },
        "Resources": resources,
    }


def check_reservations(plan: ClusterPlan, karpenter: bool) -> None:
    """eksctl targets one reservation per node group: refuse what it cannot express."""
    cluster = plan.cluster
    if not karpenter:
        ids = cluster.capacity_reservation_ids
        if ids and (len(ids) > 1 or len(cluster.instance_types) > 1):
            raise InputError(
                f"{len(ids)} capacity reservation(s) for {len(cluster.instance_types)} instance type(s): an eksctl "
                "node group targets exactly one reservation and the matrix does not say which type an id reserves",
                file=plan.matrix_file,
                line=cluster.lines.get("capacity_reservation_ids", 0),
                key=f"clusters.{cluster.name}.capacity_reservation_ids",
                fix="keep one id on a cluster with one instance type, or generate with --karpenter",
            )


def render(plans: Sequence[ClusterPlan], karpenter: bool) -> dict[str, Any]:
    """{path relative to the output directory: manifest} for every cluster; raises InputError for what
    eksctl cannot express (check_reservations)."""
    files: dict[str, Any] = {}
    for plan in plans:
        check_reservations(plan, karpenter)
        name = plan.cluster.name
        files[f"{name}/eksctl.yaml"] = render_eksctl(plan, karpenter)
        files[f"{name}/vpc-endpoints.cfn.yaml"] = render_vpc_endpoints(plan.cluster)
        files[f"{name}/results-export.cfn.yaml"] = render_results_export(plan.cluster)
        if karpenter:
            for file_name, manifest in render_karpenter(plan.cluster).items():
                files[f"{name}/karpenter/{file_name}"] = manifest
    return files
