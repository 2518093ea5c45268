"""Step `karpenter` (the level option `karpenter`, on the operator level): Karpenter's real controllers
with their kwok cloud provider, so that GPU nodes come and go as a real autoscaler decides.

    c = levels.start("operator", kueue="fsdp-p5", karpenter=True)
    c.apply(karpenter.node_pools(docs))        # the NodePools `generators/cluster.py --karpenter` wrote

What runs (sigs.k8s.io/karpenter v1.14.0, tools/cluster/go/karpenter: the core release that the AWS
provider v1.14.0, KARPENTER_VERSION of generators/render/provisioning.py, is built on): `kwok/main.go`,
Karpenter's provisioning, disruption (consolidation) and node-claim lifecycle controllers with a cloud
provider that creates a Node object for each NodeClaim instead of an EC2 instance. The Node carries
kwok's annotation, so the harness's kwok (steps/kwok.py) makes it Ready and runs its pods, as a kubelet
would. Its instance types are the catalog's (trainer/catalog.py: vCPUs, memory, GPUs, EFA devices),
offered on demand in every zone of matrix.yaml's clusters, so a NodePool that names p5.48xlarge gets a node shaped like
the fake nodes of Cluster.add_gpu_nodes.

The NodePools are generators/render/provisioning.py's for the cluster (requirements, taint, limits,
disruption policy) with two changes for the harness: the node class is kwok's (KWOKNodeClass, instead
of the EC2NodeClass that only AWS can serve), and `consolidateAfter` is a few seconds instead of
minutes, so that an empty node goes within a test.

The process runs on loopback with leader election off (one replica) and its metrics and health
servers on ports picked at start; it has no webhooks.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import yaml

from tools.cluster import build, schemas
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port
from trainer.catalog import INSTANCE_TYPES

SOURCE = schemas.Source("karpenter", "sigs.k8s.io/karpenter", ())
PROCESS = "karpenter"
NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "gpu"}
CONSOLIDATE_AFTER = "3s"
# Core's CRDs beside the karpenter.sh ones the crds step applies from the AWS provider (the same
# release's NodePool and NodeClaim): kwok's node class.
CRD_GLOBS = ("kwok/apis/crds/*.yaml",)


def matrix_zones() -> list[str]:
    """The availability zones of matrix.yaml's clusters (where their NodePools ask for nodes)."""
    clusters = yaml.safe_load((build.HERE.parent.parent / "matrix.yaml").read_text())["clusters"]
    return sorted({z for c in clusters.values() for z in c.get("availability_zones") or []})


def instance_types(zones: list[str]) -> list[dict[str, Any]]:
    """The kwok provider's instance-types file: every instance type of the catalog, on demand in `zones`."""
    found = []
    for it in INSTANCE_TYPES.values():
        resources = {"cpu": str(it.num_vcpus), "memory": f"{it.host_memory_gib}Gi", "pods": "110"}
        if it.num_gpus:
            resources["nvidia.com/gpu"] = str(it.num_gpus)
        if it.num_efa:
            resources["vpc.amazonaws.com/efa"] = str(it.num_efa)
        found.append(
            {
                "name": it.name,
                "offerings": [
                    {
                        "Price": 1.0,
                        "Available": True,
                        "Requirements": [
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]},
                        ],
                    }
                    for zone in zones
                ],
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": resources,
            }
        )
    return found


def node_pools(generated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The NodePools of `generated` (what `generators/cluster.py --karpenter` wrote for a cluster) on
    kwok's node class and with a consolidateAfter of seconds, after the node class they name."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": NODE_CLASS["name"]}}
    ]
    for doc in generated:
        if doc["kind"] != "NodePool":
            continue
        pool = copy.deepcopy(doc)
        pool["spec"]["template"]["spec"]["nodeClassRef"] = dict(NODE_CLASS)
        pool["spec"]["disruption"]["consolidateAfter"] = CONSOLIDATE_AFTER
        docs.append(pool)
    return docs


def start(c: Cluster) -> None:
    module = schemas.module_dir(SOURCE)
    args = ["apply", "--server-side", "--force-conflicts"]
    for pattern in CRD_GLOBS:
        args += [arg for f in sorted(module.glob(pattern)) for arg in ("-f", str(f))]
    c.kubectl(*args)
    c.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=180s")
    types = c.work / "karpenter-instance-types.json"
    types.write_text(json.dumps(instance_types(matrix_zones())))
    env = {
        "KUBECONFIG": str(c.kubeconfig),
        "INSTANCE_TYPES_FILE_PATH": str(types),
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(free_port()),
        "HEALTH_PROBE_PORT": str(free_port()),
        "SYSTEM_NAMESPACE": "kube-system",
        "LOG_LEVEL": "info",
        "BATCH_IDLE_DURATION": "1s",
        "BATCH_MAX_DURATION": "2s",
    }
    c.start_process(PROCESS, [build.binary("karpenter")], env={**os.environ, **env})
