"""The NCCL pre-flight check of each GPU instance type of a cluster (pure: Cluster -> manifests).

For every instance type `<t>` (family `<f>`, e.g. p5) of cluster `<c>`, under the configs overlay
that Flux Kustomization `infra-configs` applies:

    infrastructure/<c>/configs/preflight-<f>/kustomization.yaml   base/preflight, namespace, patches
    infrastructure/<c>/configs/preflight-<f>/job.preflight.yaml   the Job fsdp-preflight-<f>
    infrastructure/<c>/configs/preflight-<f>/service.preflight.yaml  its headless Service

The Job runs `python -m trainer.preflight` on two `<t>` nodes of the trainer image, with every GPU
and EFA interface of each node, expecting NCCL to use EFA where the instance has EFA (any transport
otherwise) and an all-reduce bus bandwidth of at least MIN_BUSBW_FRACTION of the instance's network
bandwidth (trainer.catalog). It fails, and raises the alert FsdpNcclPreflightFailed
(base/monitoring/configs/prometheusrule-fsdp.yaml), when either does not hold. On a cluster with Kueue
the Job carries the LocalQueue's label and is admitted like a run, as one gang of two GPU nodes; a check
that cannot run (no nodes within the deadline, repeated crashes) raises FsdpNcclPreflightNotRun instead.
"""

from __future__ import annotations

from typing import Any

from generators.core.writer import JsonPatch
from generators.matrix.schema import Cluster
from generators.render.layout import Layout
from generators.render.runs import QUEUE_LABEL, json_pointer_escape
from trainer.catalog import INSTANCE_TYPES, InstanceType

PREFLIGHT_BASE = "base/preflight"
BASE_NAME = "fsdp-preflight"
RDZV_PORT = 29400
# A quarter of the network's line rate, in GB/s of all-reduce bus bandwidth. Two healthy nodes reach
# most of the line rate (nccl-tests' busbw is comparable with it); NCCL on TCP sockets instead of
# EFA reaches a small fraction. The bar sits far from both, so noise never trips it and a fallback
# or a missing interface always does.
MIN_BUSBW_FRACTION = 0.25
_POD = "/spec/template/spec"
_CONTAINER = f"{_POD}/containers/0"


def preflight_name(instance: InstanceType) -> str:
    return f"{BASE_NAME}-{instance.family}"


def expected_transport(instance: InstanceType) -> str:
    return "efa" if instance.num_efa else "any"


def min_busbw_gbs(instance: InstanceType) -> float:
    return round(MIN_BUSBW_FRACTION * instance.network_gbps / 8, 1)


def preflight_command(instance: InstanceType) -> list[str]:
    name = preflight_name(instance)
    return [
        "python",
        "-m",
        "trainer.launch",
        "--nnodes=2",
        f"--nproc_per_node={instance.num_gpus}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{name}:{RDZV_PORT}",
        f"--rdzv-id={name}",
        "-m",
        "trainer.preflight",
        "--expect-transport",
        expected_transport(instance),
        "--min-busbw-gbs",
        str(min_busbw_gbs(instance)),
    ]


def job_patch(instance: InstanceType, queue: str = "") -> JsonPatch:
    """`queue`: the cluster's Kueue LocalQueue ("" without Kueue): the check waits for two free GPU
    nodes the way runs do, through Kueue's batch/Job integration, instead of holding one node while the
    other is busy."""
    name = preflight_name(instance)
    resources: dict[str, int] = {"nvidia.com/gpu": instance.num_gpus}
    if instance.num_efa:
        resources["vpc.amazonaws.com/efa"] = instance.num_efa
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"{_CONTAINER}/name", "value": "preflight"},
        {"op": "test", "path": f"{_POD}/volumes/0/name", "value": "shm"},
        {"op": "replace", "path": "/metadata/name", "value": name},
        *(
            [{"op": "add", "path": f"/metadata/labels/{json_pointer_escape(QUEUE_LABEL)}", "value": queue}]
            if queue
            else []
        ),
        {"op": "replace", "path": f"{_POD}/subdomain", "value": name},
        {"op": "replace", "path": f"{_POD}/nodeSelector/node.kubernetes.io~1instance-type", "value": instance.name},
        {"op": "replace", "path": f"{_CONTAINER}/command", "value": preflight_command(instance)},
        {
            "op": "replace",
            "path": f"{_CONTAINER}/resources",
            "value": {"limits": resources, "requests": dict(resources)},
        },
    ]
    if instance.num_efa:
        # As in the runs (generators/render/runs.py efa_env): insist on EFA, GPUDirect RDMA where supported.
        ops.append({"op": "add", "path": f"{_CONTAINER}/env/-", "value": {"name": "FI_PROVIDER", "value": "efa"}})
        if instance.efa_rdma:
            ops.append(
                {"op": "add", "path": f"{_CONTAINER}/env/-", "value": {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}}
            )
    return JsonPatch(tuple(ops))


def service_patch(instance: InstanceType) -> JsonPatch:
    name = preflight_name(instance)
    return JsonPatch(
        (
            {"op": "replace", "path": "/metadata/name", "value": name},
            {"op": "replace", "path": "/spec/selector/batch.kubernetes.io~1job-name", "value": name},
        )
    )


def preflight_dir(cluster: Cluster, instance: InstanceType) -> str:
    return f"infrastructure/{cluster.name}/configs/preflight-{instance.family}"


def render_preflight(cluster: Cluster, layout: Layout, queue: str = "") -> dict[str, Any]:
    """{path relative to the output directory: manifest} for every GPU instance type of the cluster;
    `queue`: the cluster's Kueue LocalQueue, "" without Kueue."""
    out: dict[str, Any] = {}
    for type_name in cluster.instance_types:
        instance = INSTANCE_TYPES[type_name]
        d = preflight_dir(cluster, instance)
        out[f"{d}/kustomization.yaml"] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": cluster.namespace,
            "resources": [layout.to_repo(d, PREFLIGHT_BASE)],
            "patches": [
                {
                    "path": "job.preflight.yaml",
                    "target": {"group": "batch", "version": "v1", "kind": "Job", "name": BASE_NAME},
                },
                {"path": "service.preflight.yaml", "target": {"version": "v1", "kind": "Service", "name": BASE_NAME}},
            ],
        }
        out[f"{d}/job.preflight.yaml"] = job_patch(instance, queue)
        out[f"{d}/service.preflight.yaml"] = service_patch(instance)
    return out
