"""Resolve expanded runs against the catalogs into Plans, and name them.

For each run, in this order: instance type (the cluster must offer it) -> GPUs per node (at most the
instance's) -> nodes (at most the cluster's max_nodes) -> the trainer config (validated by
trainer.config.from_dict, the one source of truth) -> sharding topology (trainer.config.check_topology)
-> fp8 only on GPUs with float8 tensor cores (SM 8.9 or newer) -> a memory-fit estimate -> /dev/shm
against host memory -> name, rendezvous and per-run paths.
Every failure is an InputError pointing at the matrix line that set the offending value.

Run names
---------
`<model>-<family>-n<nodes>[-g<gpus>]-<sharding>[-etcd][-r<rev>][-t<retry>]-<hash>`, for example
`llama2-7b-p5-n2-fullshard-3fa9c1`: a DNS-1035 label of at most 50 characters (the Training
Operator appends `-worker-<i>` to name pods and Services, and those must stay within 63). A readable
part longer than 43 characters loses whole trailing parts until it fits (the hash still covers them);
the run's `name` field, when set, replaces the readable part and is at most 43 characters.

`<hash>` is the first 6 hex digits of a SHA-256 over everything that shapes the job: cluster, model,
instance type, nodes, GPUs, rendezvous backend, deadline, /dev/shm size, rev, the name field and the
fully resolved trainer config. A PyTorchJob spec is effectively immutable (the operator does not
restart pods when it changes, and Flux would keep re-applying a spec the running job ignores), so
any change to a run's configuration must create a new job under a new name; the hash does that with
no bookkeeping, and it also tells apart the same experiment on two clusters with one instance type.
Consequences, on purpose: changing a trainer default in trainer/config.py renames every run whose
resolved config changes (Flux then prunes the old jobs and starts the new ones; results on the shared
volume stay under the old names); to run an unchanged configuration again, bump `rev`. To start a
finished or failed run again from its checkpoints, bump `retry`: the job gets a new name, but its
checkpoint directory stays the one of retry 0 (its metrics go to the new name's directory). Names are
stable: the same matrix and code give the same names on every machine. Two different configurations
whose 6-digit hashes collide (about one pair in a few thousand runs) both get a longer hash, two digits
at a time, until their names differ; every other run keeps its name. Two runs with the same
configuration are the same run twice and are an error.

Memory fit
----------
The peak-memory model lives in trainer/memory.py, shared with the trainer. A run whose
`activation_checkpointing` is `auto` (the default) gets the least recomputation `auto` prefers for
the instance's GPU memory, written into its config; a run whose estimate exceeds the GPU's memory
less HEADROOM_GIB even so is rejected (Llama 2 70B on one or two nodes at batch size 3): an `Unfit`
error, which the commands turn into the cheapest change that fits, the one `--plan` names
(generators/plan/estimate.py plan_fitting, where the changes are searched and priced). The
estimate is held to 10% of measured peaks by tests/test_plan_model.py; the headroom covers what it
does not count (the allocator's cache above its peak, measured; the CUDA context, NCCL's buffers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from generators.core.errors import InputError
from generators.matrix.load import Matrix
from generators.matrix.schema import RUN_FIELDS, Cluster, GitSource, RdzvBackend, Run
from trainer.catalog import FP8_MIN_COMPUTE_CAPABILITY, INSTANCE_TYPES, MODELS, capability_text, efa_for
from trainer.config import ConfigError, TrainConfig, check_topology, from_dict, to_dict
from trainer.memory import estimate_peak_gib, fits, resolve_auto, usable_text

NAME_MAX = 50
HASH_LEN = 6
# c10d: the first worker pod hosts the rendezvous store. The Training Operator (v1) names worker pods
# and their headless Services <job>-worker-<index> (genGeneralName), so the name resolves in the
# job's namespace as soon as that pod is scheduled.
C10D_PORT = 29400
# Under Kubeflow Trainer v2 (job_api: trainjob) JobSet names node i's pod <job>-node-0-<i> in the
# headless Service <job>, so the first node resolves as <job>-node-0-0.<job> once its pod exists.


def c10d_host(name: str, job_api: str) -> str:
    """The host of a run's c10d rendezvous store (its first worker pod) under the cluster's job API."""
    return f"{name}-node-0-0.{name}" if job_api == "trainjob" else f"{name}-worker-0"


# The metrics port the TrainJob runtime's container declares (base/trainjob/runtime.yaml, port "metrics").
TRAINJOB_METRICS_PORT = 8000
# etcd: the shared server in fsdp-system (base/etcd), client port 2379.
ETCD_ENDPOINT = "etcd.fsdp-system.svc.cluster.local:2379"
# Paths on the shared volume (PVC fsdp-shared mounted at /shared in every run pod).
SHARED_MOUNT = "/shared"
CHECKPOINT_ROOT = f"{SHARED_MOUNT}/checkpoints"
RUNS_ROOT = f"{SHARED_MOUNT}/runs"
# Trainer keys the planner sets for every run; the matrix must not set them.
GENERATED_TRAINER_KEYS = {
    "model.name": "set the run's `model` field instead",
    "checkpoint.dir": f"the planner sets it to {CHECKPOINT_ROOT}/<run name>",
    "metrics.output_dir": f"the planner sets it to {RUNS_ROOT}/<run name>",
}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A run resolved against the catalogs: everything a renderer needs, nothing to look up."""

    # Run name: DNS-1035 label, at most 50 characters; also the PyTorchJob name.
    name: str
    # Cluster name (key of `clusters`).
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
    # The run as the matrix gave it, for run fields that need no resolving (a renderer reads a new run
    # field here; the resolved values above win where both exist).
    run: Run


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """One cluster and everything planned for it: what every renderer takes (never the matrix)."""

    # The matrix path as given: errors about the cluster name it.
    matrix_file: str
    cluster: Cluster
    # The Git repository the cluster's Flux syncs.
    source: GitSource
    # The cluster's runs, in matrix order.
    runs: tuple[Plan, ...]


def plan(matrix: Matrix, runs: Sequence[Run]) -> list[ClusterPlan]:
    """Plan every run (raise InputError on the first bad one) and group the plans by cluster, in the
    order of the matrix's `clusters`."""
    plans = plan_runs(matrix, runs)
    return [
        ClusterPlan(
            matrix_file=matrix.file,
            cluster=c,
            source=matrix.repository,
            runs=tuple(p for p in plans if p.cluster == name),
        )
        for name, c in matrix.clusters.items()
    ]


class Unfit(InputError):
    """A run whose memory estimate exceeds its GPUs' memory: generators/plan/estimate.py's
    plan_fitting gives it the cheapest change that fits, the one `--plan` names."""

    def __init__(self, error: InputError, run: Run):
        super().__init__(error.message, file=error.file, line=error.line, key=error.key, fix=error.fix)
        self.run = run


def plan_runs(matrix: Matrix, runs: Sequence[Run], *, reject_unfit: bool = True) -> list[Plan]:
    """Plan every run in order; two runs with the same name are an error. `reject_unfit=False` plans
    a run that cannot fit as well (`expand.py --plan` refuses it with a fix instead)."""
    cache: dict[str, TrainConfig] = {}
    plans = [plan_run(matrix, run, cache, reject_unfit=reject_unfit) for run in runs]
    # Different configurations whose names collide (the short hash is shared by about one pair in a
    # few thousand runs) get a longer hash, two digits at a time, until every name is unique; a run
    # that collides with nothing keeps its short name, so names stay stable.
    lengths = [HASH_LEN] * len(plans)
    while True:
        by_name: dict[str, list[int]] = {}
        for i, p in enumerate(plans):
            by_name.setdefault(p.name, []).append(i)
        clashes = [ix for ix in by_name.values() if len(ix) > 1]
        if not clashes:
            return plans
        for ix in clashes:
            for j in ix[1:]:
                if _configuration(plans[j]) == _configuration(plans[ix[0]]):
                    first = runs[ix[0]]
                    raise InputError(
                        f"run {plans[j].name} has the same configuration as {first.entry_key} "
                        f"(line {first.entry_line})",
                        file=matrix.file,
                        line=runs[j].entry_line,
                        key=runs[j].entry_key,
                        fix="remove the duplicate; to run a configuration again on purpose, bump rev",
                    )
            for j in ix:
                lengths[j] += 2
                plans[j] = plan_run(matrix, runs[j], cache, reject_unfit=reject_unfit, hash_len=lengths[j])


def _configuration(p: Plan) -> tuple:
    """What the name's hash stands for: every run field as resolved, and the resolved trainer config."""
    fields = {f: getattr(p.run, f) for f in RUN_FIELDS}
    fields.update(instance_type=p.instance_type, gpus_per_node=p.gpus_per_node)
    return repr(sorted(fields.items())), repr(to_dict(p.trainer))


def where(matrix: Matrix, run: Run, path: str) -> tuple[int, str]:
    """Line and matrix key of the value at run path `path` (or of its closest set parent/child)."""
    probe = path
    while probe:
        if probe in run.sources:
            return run.sources[probe]
        probe = probe.rpartition(".")[0]
    for p, src in run.sources.items():
        if p.startswith(path + "."):
            return src
    return run.entry_line, f"{run.entry_key}.{path}"


def _fail(matrix: Matrix, run: Run, path: str, message: str, fix: str, readable: str = "") -> InputError:
    line, key = where(matrix, run, path)
    if readable:
        message = f"{message} (run {readable})"
    return InputError(message, file=matrix.file, line=line, key=key, fix=fix)


def slug(text: str) -> str:
    """'llama3.1-8b' -> 'llama3-1-8b'; 'HYBRID_SHARD' -> 'hybridshard'."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def readable_name(
    run: Run, family: str, gpus_per_node: int, num_gpus: int, sharding: str, hash_len: int | None = None
) -> str:
    """The human part of the name (the run's `name` field when set), at most 43 characters."""
    if run.name:
        text = run.name
    else:
        parts = [slug(run.model), family, f"n{run.nodes}"]
        if gpus_per_node != num_gpus:
            parts.append(f"g{gpus_per_node}")
        parts.append(sharding.lower().replace("_", ""))
        if run.rdzv_backend != "c10d":
            parts.append(run.rdzv_backend)
        if run.rev:
            parts.append(f"r{run.rev}")
        if run.retry:
            parts.append(f"t{run.retry}")
        text = "-".join(parts)
    limit = NAME_MAX - (hash_len or HASH_LEN) - 1
    if len(text) > limit:
        # Drop whole trailing parts (a cut "-r12" would read as rev 1); the hash still tells them apart.
        text = text[: limit + 1].rsplit("-", 1)[0] if "-" in text[: limit + 1] else text[:limit]
    return text.rstrip("-")


def config_hash(payload: dict[str, Any], length: int | None = None) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[: length or HASH_LEN]


def _trainer_fix(key: str) -> str:
    return f"correct trainer.{key} (the trainer's keys and values are defined in trainer/config.py)"


def plan_run(
    matrix: Matrix,
    run: Run,
    cache: dict[str, TrainConfig] | None = None,
    *,
    reject_unfit: bool = True,
    hash_len: int | None = None,
) -> Plan:
    """Resolve one run (see the module docstring for the order of checks). `hash_len`: hex digits of
    the configuration hash in the name (plan_runs lengthens it where two names would collide)."""
    cluster = matrix.clusters[run.cluster]

    instance_name = run.instance_type
    if not instance_name:
        if len(cluster.instance_types) != 1:
            raise _fail(
                matrix,
                run,
                "instance_type",
                f"cluster {cluster.name} offers {len(cluster.instance_types)} instance types",
                f"set instance_type to one of {', '.join(cluster.instance_types)}",
            )
        instance_name = cluster.instance_types[0]
    elif instance_name not in cluster.instance_types:
        raise _fail(
            matrix,
            run,
            "instance_type",
            f"cluster {cluster.name} does not offer {instance_name}",
            f"use one of {', '.join(cluster.instance_types)} or add it to clusters.{cluster.name}.instance_types",
        )
    instance = INSTANCE_TYPES[instance_name]

    gpus = run.gpus_per_node or instance.num_gpus
    if gpus > instance.num_gpus:
        raise _fail(
            matrix,
            run,
            "gpus_per_node",
            f"{gpus} GPUs per node, but {instance_name} has {instance.num_gpus}",
            f"use 1 to {instance.num_gpus}, or leave gpus_per_node out to use every GPU",
        )
    if run.nodes > cluster.max_nodes:
        raise _fail(
            matrix,
            run,
            "nodes",
            f"{run.nodes} nodes, but cluster {cluster.name} scales to {cluster.max_nodes}",
            f"use at most {cluster.max_nodes} nodes or raise clusters.{cluster.name}.max_nodes",
        )
    world = run.nodes * gpus

    for key, why in GENERATED_TRAINER_KEYS.items():
        if f"trainer.{key}" in run.sources:
            raise _fail(matrix, run, f"trainer.{key}", "is set by the generator, not the matrix", f"remove it ({why})")
    arch = MODELS[run.model]
    trainer_data = dict(run.trainer)
    model_section = dict(trainer_data.get("model", {}))
    model_section["name"] = run.model
    model_section.setdefault("path", arch.hf_id)
    trainer_data["model"] = model_section

    # repr keeps 1, 1.0 and True apart; equal configs written in another key order only miss the cache.
    cache_key = repr(trainer_data)
    cfg = cache.get(cache_key) if cache is not None else None
    if cfg is None:
        try:
            cfg = from_dict(trainer_data)
        except ConfigError as err:
            raise _fail(
                matrix, run, f"trainer.{err.key}" if err.key else "trainer", err.message, _trainer_fix(err.key)
            ) from None
        if cache is not None:
            cache[cache_key] = cfg

    if cfg.metrics.prometheus_port == C10D_PORT:
        raise _fail(
            matrix,
            run,
            "trainer.metrics.prometheus_port",
            f"port {C10D_PORT} is the c10d rendezvous port of every run pod",
            "use another port for the metrics, e.g. 8000",
        )
    if cluster.job_api == "trainjob" and cfg.metrics.prometheus_port not in (0, TRAINJOB_METRICS_PORT):
        raise _fail(
            matrix,
            run,
            "trainer.metrics.prometheus_port",
            f"port {cfg.metrics.prometheus_port}: the TrainJob runtime declares the metrics port "
            f"{TRAINJOB_METRICS_PORT} (base/trainjob/runtime.yaml) and a TrainJob cannot change a port",
            f"use {TRAINJOB_METRICS_PORT} (or 0 for no metrics) on a job_api: trainjob cluster",
        )
    par = cfg.parallelism
    if par.precision == "fp8" and instance.compute_capability < FP8_MIN_COMPUTE_CAPABILITY:
        raise _fail(
            matrix,
            run,
            "trainer.parallelism.precision",
            f"fp8 needs float8 tensor cores ({capability_text(FP8_MIN_COMPUTE_CAPABILITY)} or newer), but "
            f"{instance_name} has {instance.gpu_model} GPUs ({capability_text(instance.compute_capability)}), "
            "where fp8 is only emulated and runs slower than bf16",
            f"set trainer.parallelism.precision: bf16 for runs on {instance_name}",
        )
    try:
        shard_size = check_topology(par, world, gpus)
    except ConfigError as err:
        raise _fail(
            matrix,
            run,
            f"trainer.{err.key}",
            err.message,
            f"use a shard_group_size that divides {world} (nodes x GPUs per node), or 0 for one node",
        ) from None

    family = instance.family
    readable = readable_name(run, family, gpus, instance.num_gpus, par.sharding_strategy, hash_len)
    cfg = resolve_auto(arch, cfg, shard_size, instance.gpu_memory_gib)
    est = estimate_peak_gib(arch, cfg, shard_size)
    if reject_unfit and not fits(est, instance.gpu_memory_gib):
        # The commands refuse it with --plan's cheapest change that fits (estimate.plan_fitting).
        raise Unfit(
            _fail(
                matrix,
                run,
                "nodes",
                f"{run.model} needs about {est:.0f} GiB per GPU with {par.sharding_strategy} over "
                f"{shard_size} GPUs, but {instance_name} GPUs have {usable_text(instance.gpu_memory_gib)}",
                f"python generators/expand.py {matrix.file} --plan names the cheapest change that fits",
                readable,
            ),
            run,
        )
    shm_cap = instance.host_memory_gib * gpus // instance.num_gpus // 2
    if run.shm_size_gib > shm_cap:
        raise _fail(
            matrix,
            run,
            "shm_size_gib",
            f"{run.shm_size_gib} GiB of /dev/shm is more than half the host memory of the GPUs' share "
            f"of {instance_name}",
            f"use at most {shm_cap}",
            readable,
        )

    def run_name(r: Run, text: str) -> str:
        # Every run field (as resolved) and the resolved trainer config: a new run field joins the hash.
        return (
            text
            + "-"
            + config_hash(
                {
                    **{f: getattr(r, f) for f in RUN_FIELDS},
                    "instance_type": instance_name,
                    "gpus_per_node": gpus,
                    "trainer": to_dict(cfg),
                },
                hash_len,
            )
        )

    name = run_name(run, readable)
    # A retry is the same run started again: a new job name, the checkpoint directory of retry 0.
    first = dataclasses.replace(run, retry=0)
    lineage = run_name(first, readable_name(first, family, gpus, instance.num_gpus, par.sharding_strategy, hash_len))
    cfg = dataclasses.replace(
        cfg,
        checkpoint=dataclasses.replace(cfg.checkpoint, dir=f"{CHECKPOINT_ROOT}/{lineage}"),
        metrics=dataclasses.replace(cfg.metrics, output_dir=f"{RUNS_ROOT}/{name}"),
    )
    endpoint = f"{c10d_host(name, cluster.job_api)}:{C10D_PORT}" if run.rdzv_backend == "c10d" else ETCD_ENDPOINT
    return Plan(
        name=name,
        cluster=cluster.name,
        namespace=cluster.namespace,
        model=run.model,
        hf_id=arch.hf_id,
        instance_type=instance_name,
        gpu_model=instance.gpu_model,
        gpu_memory_gib=instance.gpu_memory_gib,
        nodes=run.nodes,
        gpus_per_node=gpus,
        world_size=world,
        efa_per_node=efa_for(instance, gpus),
        efa_rdma=instance.efa_rdma and instance.num_efa > 0,
        sharding=par.sharding_strategy,
        shard_group_size=shard_size,
        overlay_dir=f"runs/{cluster.name}/{name}",
        rdzv_backend=run.rdzv_backend,
        rdzv_endpoint=endpoint,
        rdzv_id=name,
        active_deadline_s=run.active_deadline_s,
        shm_size_gib=run.shm_size_gib,
        est_gpu_memory_gib=round(est, 1),
        trainer=cfg,
        run=run,
    )
