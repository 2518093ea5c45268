"""The generator's domain objects: what a cluster offers, what a run asks for, what a run becomes.

Data flows one way: matrix.yaml -> `Matrix` (generators/matrix.py) -> [`Run`] (expand) -> [`Plan`]
(plan) -> {path: manifest} (render) -> files (writer). Every object here is a frozen, keyword-only
dataclass without I/O, so renderers (generators/render.py for runs, generators/clusters.py for the
per-cluster Flux entry and infrastructure) receive plain, immutable values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from trainer.config import TrainConfig

RdzvBackend = Literal["c10d", "etcd"]


@dataclass(frozen=True, kw_only=True)
class Repository:
    """The Git repository Flux syncs from (the matrix's top-level `repository`)."""

    # Clone URL Flux's GitRepository uses, e.g. https://github.com/example/fsdp-gitops or ssh://git@...
    url: str
    # Branch Flux follows.
    branch: str


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """What one EKS cluster offers (an entry of the matrix's `clusters`)."""

    # Cluster name: the key under `clusters`; a DNS-1123 label (used in paths and object names).
    name: str
    # Namespace the PyTorchJobs of this cluster run in (holds Secret hf-token and PVC fsdp-shared).
    namespace: str
    # GPU instance types of the cluster's node groups (keys of generators.catalog.INSTANCE_TYPES),
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


@dataclass(frozen=True, kw_only=True)
class Run:
    """One expanded matrix entry, before any catalog lookup (output of matrix.expand)."""

    # Cluster name (key of `clusters`).
    cluster: str
    # Model name (key of trainer.catalog.MODELS).
    model: str
    # EC2 instance type the run's pods are pinned to; "" means the cluster's only instance type.
    instance_type: str
    # Number of nodes, one worker pod per node.
    nodes: int
    # GPUs (torchrun processes) per node; 0 in the matrix means every GPU of the instance.
    gpus_per_node: int
    # Rendezvous backend for torchrun: c10d (first worker pod hosts the store) or etcd.
    rdzv_backend: RdzvBackend
    # Hard cap on the job's wall-clock time (PyTorchJob runPolicy.activeDeadlineSeconds), seconds.
    active_deadline_s: int
    # Size limit of the memory-backed /dev/shm volume per pod, GiB.
    shm_size_gib: int
    # Run counter: bump it to launch the same configuration again under a new name.
    rev: int
    # Readable part of the name chosen by the user (DNS-1035); empty means the generated one.
    name: str
    # The trainer config as nested plain data, still unvalidated (plan validates it with
    # trainer.config.from_dict).
    trainer: Any
    # Where the run came from, for error messages: "axes", "include[3]" ... and that entry's line.
    entry_key: str
    entry_line: int
    # Run path ("nodes", "trainer.training.lr") -> (line, full matrix key) of the value that set it.
    sources: Mapping[str, tuple[int, str]]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A run resolved against the catalogs: everything a renderer needs, nothing to look up."""

    # Run name: DNS-1035 label, at most 50 characters; also the PyTorchJob name.
    name: str
    # Cluster name (key of `clusters`); the Cluster itself is passed to render_cluster.
    cluster: str
    # Namespace of the PyTorchJob (the cluster's namespace).
    namespace: str
    # Model name (key of trainer.catalog.MODELS) and its Hugging Face id ("" for test models).
    model: str
    hf_id: str
    # EC2 instance type, its GPU model ("A100", "H100", "H200") and GPU memory per GPU, GiB.
    instance_type: str
    gpu_model: str
    gpu_memory_gib: int
    # Worker pods (one per node) and GPUs per pod; world_size = nodes * gpus_per_node.
    nodes: int
    gpus_per_node: int
    world_size: int
    # EFA interfaces requested per pod (vpc.amazonaws.com/efa).
    efa_per_node: int
    # Whether the instance supports EFA RDMA (FI_EFA_USE_DEVICE_RDMA=1).
    efa_rdma: bool
    # FSDP sharding strategy and the group size parameters are sharded over (world size for
    # FULL_SHARD / SHARD_GRAD_OP, the shard group for HYBRID_SHARD, 1 for NO_SHARD).
    sharding: str
    shard_group_size: int
    # Relative to the output directory: runs/<cluster>/<name>.
    overlay_dir: str
    # torchrun rendezvous: backend, endpoint host:port, and an id unique to the run.
    rdzv_backend: RdzvBackend
    rdzv_endpoint: str
    rdzv_id: str
    # Hard cap on GPU time, seconds (runPolicy.activeDeadlineSeconds).
    active_deadline_s: int
    # /dev/shm size limit per pod, GiB.
    shm_size_gib: int
    # Estimated peak GPU memory per GPU, GiB (the estimate the fit check used).
    est_gpu_memory_gib: float
    # The resolved trainer config (to_dict of it goes into the run's ConfigMap as train.yaml).
    trainer: TrainConfig
