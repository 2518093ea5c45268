"""What an experiment matrix may say, written once: the run fields, the cluster and Git source fields.

`Run` is the schema of a run: every field declared with `run_field` is a key the matrix accepts in
`defaults`, an axis or an `include`/`exclude` entry, with the type of its annotation, the default the
expansion uses when no entry sets it (none: every run must set it), the least value it accepts and,
for a `Literal` annotation, the values it accepts. The loader (generators/matrix/load.py), the
expansion and the planner's configuration hash read the fields from here, so a new run field is one
declaration below plus the code that uses it. The trainer section's keys come from
trainer.config.TrainConfig (`trainer_schema`).

Every object is a frozen, keyword-only dataclass without I/O.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from trainer.config import TrainConfig

RdzvBackend = Literal["c10d", "etcd"]
TransportCheck = Literal["fail", "warn", "off"]
# The trainer image a run uses unless it sets `image`: the image of base/pytorchjob (a test holds them
# equal). Part of the run's configuration hash like every run field, so a new image never changes a
# running job: it reaches the runs that name it (docs/operations.md, new images).
DEFAULT_IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/fsdp-gitops/trainer:0.1.0"
# The registry of DEFAULT_IMAGE (and of the image of base/data-staging and base/preflight): an ECR
# registry, one per region. A run that sets no image takes DEFAULT_IMAGE from the registry of its
# cluster's region, so no cluster pulls a multi-GB image across regions.
DEFAULT_REGISTRY = DEFAULT_IMAGE.split("/", 1)[0]


def ecr_registry(region: str, registry: str = DEFAULT_REGISTRY) -> str:
    """`registry` (an ECR registry host) moved to `region`; any other registry as it is."""
    account, sep, rest = registry.partition(".dkr.ecr.")
    return f"{account}.dkr.ecr.{region}.amazonaws.com" if sep and rest.endswith(".amazonaws.com") else registry


def with_registry(image: str, registry: str) -> str:
    """`image` pulled from `registry`: the same repository path and tag (or digest)."""
    first, sep, rest = image.partition("/")
    has_host = sep and ("." in first or ":" in first or first == "localhost")
    return f"{registry}/{rest if has_host else image}"


def cluster_image(image: str, region: str, registry: str) -> str:
    """The image a cluster's pods pull for `image` (DEFAULT_IMAGE or any image of its registry): from
    the cluster's `registry` when it names one, else from DEFAULT_REGISTRY moved to its region."""
    if registry:
        return with_registry(image, registry)
    if image.split("/", 1)[0] == DEFAULT_REGISTRY:
        return with_registry(image, ecr_registry(region))
    return image


# The job API a cluster's runs are written for: the Kubeflow Training Operator's PyTorchJob (v1,
# kubeflow.org) or Kubeflow Trainer v2's TrainJob (trainer.kubeflow.org, on JobSet); docs/job-api.md.
JobApi = Literal["pytorchjob", "trainjob"]
JOB_APIS: tuple[str, ...] = typing.get_args(JobApi)

API_VERSION = "fsdp-gitops/v1"
KIND = "ExperimentMatrix"
TOP_LEVEL_KEYS = ("apiVersion", "kind", "repository", "clusters", "defaults", "axes", "include", "exclude")
# A run's `name` field is at most this long: the planner appends "-" and the configuration hash.
NAME_PREFIX_MAX = 43

REQUIRED: Any = dataclasses.MISSING


def run_field(default: Any = REQUIRED, *, minimum: int | None = None, maximum: int | None = None) -> Any:
    """Declare a run field of the matrix. `default`: its value when no entry sets it (REQUIRED: every
    run must set it); `minimum`, `maximum`: the range the matrix may give it (integers; the maximum
    defaults to int32, what Kubernetes accepts for replicas, ports and sizes)."""
    return field(default=default, metadata={"run_field": True, "minimum": minimum, "maximum": maximum})


@dataclass(frozen=True, kw_only=True)
class Run:
    """One expanded matrix entry, before any catalog lookup (output of matrix.expand)."""

    # Cluster name (a key of `clusters`).
    cluster: str = run_field()
    # Model name (a key of trainer.catalog.MODELS); also sets trainer.model.name.
    model: str = run_field()
    # EC2 instance type the run's pods are pinned to; "" means the cluster's only instance type (an
    # error when it offers several).
    instance_type: str = run_field("")
    # Number of nodes, one worker pod per node.
    nodes: int = run_field(minimum=1)
    # GPUs (torchrun processes) per node; 0 (the default) means every GPU of the instance.
    gpus_per_node: int = run_field(0, minimum=1)
    # Rendezvous backend for torchrun: c10d (the first worker pod hosts the store) or etcd
    # (the fsdp-system/etcd server).
    rdzv_backend: RdzvBackend = run_field("c10d")
    # Hard cap on the job's wall-clock time (PyTorchJob runPolicy.activeDeadlineSeconds), seconds.
    active_deadline_s: int = run_field(86400, minimum=60, maximum=2**63 - 1)
    # Size limit of the memory-backed /dev/shm volume per pod, GiB.
    shm_size_gib: int = run_field(64, minimum=1)
    # Run counter: bump it to launch an unchanged configuration again under a new name.
    rev: int = run_field(0, minimum=0)
    # Retry counter: bump it to start a finished or failed run again from its checkpoints. The job
    # gets a new name (a PyTorchJob cannot be restarted), the checkpoint directory stays the one of
    # retry 0, so the trainer resumes from the newest complete checkpoint there.
    retry: int = run_field(0, minimum=0)
    # Readable part of the run name instead of the generated one (DNS-1035, at most NAME_PREFIX_MAX
    # characters); the planner always appends the configuration hash.
    name: str = run_field("")
    # The trainer image (registry/repository:tag) of the run's pods.
    image: str = run_field(DEFAULT_IMAGE)
    # Restarts of a worker pod after a retryable exit (preemption, OOM kill, lost node) before the job
    # fails: trainer.launch counts the pod's starts on the shared volume (trainer/attempts.py), since the
    # Training Operator does not count these against backoffLimit.
    max_retries: int = run_field(10, minimum=0)
    # Multi-node runs on EFA instances: NCCL on another transport than EFA fails the run at its start
    # (fail), only says so (warn), or is not checked (off); trainer/transport_check.py.
    transport_check: TransportCheck = run_field("fail")

    # Not run fields: what the expansion records about the run.
    # The trainer config as nested plain data, still unvalidated (the planner validates it with
    # trainer.config.from_dict).
    trainer: Any
    # Where the run came from, for error messages: "axes", "include[3]" ... and that entry's line.
    entry_key: str
    entry_line: int
    # Run path ("nodes", "trainer.training.lr") -> (line, full matrix key) of the value that set it.
    sources: Mapping[str, tuple[int, str]]


@dataclass(frozen=True)
class RunField:
    """A run field as the loader checks it."""

    name: str
    type: type
    default: Any  # REQUIRED when every run must set it
    minimum: int | None
    maximum: int | None
    choices: tuple[Any, ...]  # the values a Literal field accepts; empty otherwise


def _run_fields() -> dict[str, RunField]:
    hints = typing.get_type_hints(Run)
    out = {}
    for f in dataclasses.fields(Run):
        if not f.metadata.get("run_field"):
            continue
        hint = hints[f.name]
        choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else ()
        tp = type(choices[0]) if choices else hint
        out[f.name] = RunField(f.name, tp, f.default, f.metadata["minimum"], f.metadata["maximum"], choices)
    return out


RUN_FIELDS: dict[str, RunField] = _run_fields()


@dataclass(frozen=True, kw_only=True)
class GitSource:
    """The Git repository Flux syncs from (the matrix's top-level `repository`)."""

    # Clone URL Flux's GitRepository uses, e.g. https://github.com/example/fsdp-gitops or ssh://git@...
    url: str
    # Branch Flux follows.
    branch: str


# Fields of `repository` and of each cluster: name -> (type, default); None means required.
REPOSITORY_FIELDS: dict[str, tuple[Any, Any]] = {"url": (str, None), "branch": (str, "main")}
CLUSTER_FIELDS: dict[str, tuple[Any, Any]] = {
    "namespace": (str, "fsdp"),
    "instance_types": (list, None),
    "region": (str, None),
    "availability_zones": (list, None),
    "capacity_reservation_ids": (list, []),
    "volume_size_gib": (int, 500),
    "kubernetes_version": (str, "1.33"),
    "max_nodes": (int, 16),
    "shared_storage_gib": (int, 1200),
    "kueue": (bool, True),
    "capacity_blocks": (bool, False),
    "job_api": (str, "pytorchjob"),
    "capacity_block_end": (str, ""),
    "registry": (str, ""),
}


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """What one EKS cluster offers (an entry of the matrix's `clusters`)."""

    # Cluster name: the key under `clusters`; a DNS-1123 label (used in paths and object names).
    name: str
    # Namespace the PyTorchJobs of this cluster run in (holds Secret hf-token and PVC fsdp-shared).
    namespace: str
    # GPU instance types of the cluster's node groups (keys of trainer.catalog.INSTANCE_TYPES),
    # in matrix order. DaemonSets and the DCGM exporter are pinned to exactly these.
    instance_types: tuple[str, ...]
    # AWS region, e.g. us-west-2.
    region: str
    # Availability zones of the GPU node groups, e.g. ("us-west-2a",). Capacity reservations and
    # EFA placement live in one zone, so GPU node groups usually name exactly one.
    availability_zones: tuple[str, ...]
    # EC2 On-Demand Capacity Reservation / Capacity Block ids (cr-...); empty when On-Demand.
    capacity_reservation_ids: tuple[str, ...]
    # Root EBS volume per GPU node, GiB (container images of the trainer are large).
    volume_size_gib: int
    # EKS Kubernetes version (minor), e.g. "1.33".
    kubernetes_version: str
    # Most GPU nodes the cluster's node groups may scale to, per instance type.
    max_nodes: int
    # Size of the shared ReadWriteMany volume (PVC fsdp-shared, mounted at /shared), GiB.
    shared_storage_gib: int
    # Queue the cluster's jobs with Kueue (admitted as whole gangs within the cluster's GPU quota).
    # Off on a trainjob cluster, where `kueue: true` is refused: the pinned Kueue admits a TrainJob with
    # older Trainer types that drop its runtimePatches, and its JobSet never starts (docs/job-api.md).
    kueue: bool = True
    # The capacity reservation ids are EC2 Capacity Blocks for ML (launched with market type
    # capacity-block), not On-Demand Capacity Reservations.
    capacity_blocks: bool = False
    # The API the cluster's runs use: "pytorchjob" (Training Operator v1) or "trainjob" (Kubeflow
    # Trainer v2 with JobSet); the plan, the names and the trainer are the same for both.
    job_api: JobApi = "pytorchjob"
    # End time of the cluster's Capacity Block (ISO 8601 with a zone, e.g. "2026-12-10T11:30:00Z"); ""
    # when none. Runs checkpoint and stop before it (trainer/capacity_block.py), through ConfigMap
    # fsdp-capacity-block, so changing it never rewrites a job.
    capacity_block_end: str = ""
    # Registry the cluster's pods pull the trainer image from (a host, e.g.
    # 222233334444.dkr.ecr.eu-west-1.amazonaws.com): every run's image and the staging and pre-flight
    # Jobs' image, with the same repository path and tag. "": the default image's ECR registry in the
    # cluster's region; images of other registries as written.
    registry: str = ""
    # 1-based matrix line of each field that the matrix sets (and of the cluster's own key under
    # "name"), for errors raised after loading.
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)


def base_image_override(cluster: Cluster) -> list[dict[str, str]]:
    """kustomize `images:` that moves the trainer image of base/data-staging and base/preflight to the
    cluster's registry (the tag stays the base's, which image automation updates); [] when it is the
    same."""
    name = DEFAULT_IMAGE.rsplit(":", 1)[0]
    moved = cluster_image(name, cluster.region, cluster.registry)
    return [{"name": name, "newName": moved}] if moved != name else []


@lru_cache(maxsize=1)
def trainer_schema() -> dict[str, Any]:
    """The trainer config's key tree: section -> {key: None for a value, or a nested tree}."""

    def tree(cls: type) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        return {
            f.name: tree(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else None
            for f in dataclasses.fields(cls)
        }

    return tree(TrainConfig)


@lru_cache(maxsize=1)
def run_schema() -> dict[str, Any]:
    """The key tree of one run: run fields (values) and the trainer section."""
    return {**{name: None for name in RUN_FIELDS}, "trainer": trainer_schema()}


def schema_at(path: str) -> Any:
    """The schema node of a run path ("" = the run): None for a value, a dict for a section.

    Raises KeyError naming the first unknown part.
    """
    node: Any = run_schema()
    if not path:
        return node
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(part)
        node = node[part]
    return node


def known_at(path: str) -> list[str]:
    """Keys valid right below `path` ("" = the run itself), for error hints."""
    node = schema_at(path)
    return sorted(node) if isinstance(node, dict) else []
