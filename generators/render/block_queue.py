"""The Capacity Block queue hold of a cluster (base/capacity-block, trainer/block_queue.py): rendered into
infrastructure/<cluster>/configs/capacity-block/ where the cluster's reservations are Capacity Blocks and
it queues with Kueue. Pure: ClusterPlan -> manifests."""

from __future__ import annotations

from typing import Any

from generators.core.writer import JsonPatch
from generators.matrix.schema import Cluster
from generators.plan import ClusterPlan
from generators.render.data import KUSTOMIZE_API
from generators.render.layout import Layout
from generators.render.runs import FSDP_GRACE_ENV, TERM_SLACK_S, termination_grace_s

# The queue hold at a Capacity Block's end (holds_queue_at_block_end): base and its folder in configs/.
BLOCK_QUEUE_BASE = "base/capacity-block"
BLOCK_QUEUE_DIR = "capacity-block"
BLOCK_QUEUE_NAME = "fsdp-block-queue"


def holds_queue_at_block_end(cluster: Cluster) -> bool:
    """Whether the cluster runs the Capacity Block queue hold (base/capacity-block, trainer/block_queue.py)."""
    return cluster.capacity_blocks and cluster.kueue


def render_block_queue(plan: ClusterPlan, layout: Layout) -> dict[str, Any]:
    """configs/capacity-block/ of a Capacity Block cluster that queues with Kueue: the hold of ClusterQueue
    fsdp from the earliest stop time of its runs (the longest checkpoint grace among them) on."""
    cluster = plan.cluster
    if not holds_queue_at_block_end(cluster):
        return {}
    d = f"infrastructure/{cluster.name}/configs/{BLOCK_QUEUE_DIR}"
    grace = max((termination_grace_s(p) - TERM_SLACK_S for p in plan.runs), default=30)
    return {
        f"{d}/kustomization.yaml": {
            "apiVersion": KUSTOMIZE_API,
            "kind": "Kustomization",
            "namespace": cluster.namespace,
            "resources": [layout.to_repo(d, BLOCK_QUEUE_BASE)],
            "patches": [
                {
                    "path": "deployment.block-queue.yaml",
                    "target": {"group": "apps", "version": "v1", "kind": "Deployment", "name": BLOCK_QUEUE_NAME},
                },
                {
                    "path": "clusterrolebinding.block-queue.yaml",
                    "target": {
                        "group": "rbac.authorization.k8s.io",
                        "kind": "ClusterRoleBinding",
                        "name": BLOCK_QUEUE_NAME,
                    },
                },
            ],
        },
        f"{d}/deployment.block-queue.yaml": JsonPatch(
            (
                {"op": "test", "path": "/spec/template/spec/containers/0/env/2/name", "value": FSDP_GRACE_ENV},
                {"op": "replace", "path": "/spec/template/spec/containers/0/env/2/value", "value": str(grace)},
            )
        ),
        f"{d}/clusterrolebinding.block-queue.yaml": JsonPatch(
            ({"op": "replace", "path": "/subjects/0/namespace", "value": cluster.namespace},)
        ),
    }
