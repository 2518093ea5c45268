"""What every run of a matrix will need and cost, before it runs: the table `expand.py --plan` prints.

Per run: world size; peak GPU memory per GPU (trainer/memory.py) against the GPU's; host memory
per node while the weights load against the GPUs' share of the host; tokens/s per GPU and step
(speed.py), marked where the speed model is outside its calibration; what the run spends besides
its steps (overheads.py: start, model load, data staging, the blocking part of its saves, the final
save and export); hours (steps and those terms), GPU-hours and cost from the price table (cost.py).
Totals per cluster.

A run that cannot fit (its memory estimate above the GPU less the measured headroom, trainer.memory.fits,
or its loading above the host memory) is refused with the reason and the cheapest change that fixes it:
of each family of changes below, the least change that makes the run fit is planned, and of those
the one with the lowest predicted cost wins (GPU-hours where the instance has no price; within 1%,
the earlier family):
- more nodes: the fewest up to the cluster's max_nodes (with HYBRID_SHARD, and a shard group grown
  with them);
- activation checkpointing: selective, then full, where the run fixed a mode that recomputes less;
- a larger HYBRID_SHARD group (doubling up to the world), or FULL_SHARD instead of NO_SHARD or
  SHARD_GRAD_OP;
- fp8 with the float8 all-gather (the gathered decoder weights take 1 byte instead of 2);
- a smaller batch per GPU, with gradient accumulation keeping the global batch where it divides.

Host memory while loading, per node: every rank holds its shard of the bf16 weights (trainer/model.py
reads each rank's rows only), one full fp32 tensor in flight (random initialisation draws whole
tensors), and RANK_HOST_BASE_GIB for the process itself (torch, CUDA and NCCL host state; an
assumption, not measured here).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from generators.core.errors import InputError
from generators.matrix.load import Matrix
from generators.matrix.schema import Cluster, Run
from generators.plan import ClusterPlan, Plan, Unfit, plan_runs, where
from generators.plan import plan as plan_clusters
from generators.plan.cost import PriceTable, load_prices
from generators.plan.overheads import (
    ASYNC_MODES,
    CheckpointRates,
    Overheads,
    async_mode,
    overheads,
    read_checkpoint_rates,
)
from generators.plan.overheads import notes as overhead_notes
from generators.plan.speed import (
    NETWORK_EFFICIENCY,
    NVLINK_EFFICIENCY,
    Speed,
    Topology,
    hardware,
    predict,
    steps_per_epoch,
)
from trainer.catalog import FP8_MIN_COMPUTE_CAPABILITY, INSTANCE_TYPES, MODELS, Architecture, InstanceType
from trainer.config import ConfigError, TrainConfig, check_topology, to_dict
from trainer.memory import estimate_peak_gib, fits, resolve_auto, usable_text

GIB = 1024**3
RANK_HOST_BASE_GIB = 4.0
# Fraction of the host's memory (the GPUs' share of it) that loading may take; the rest is for
# /dev/shm, the data loader and the kubelet.
HOST_FIT_FRACTION = 0.5
COST_TIE = 0.01


@dataclass(frozen=True, kw_only=True)
class Figures:
    """One configuration of a run, estimated."""

    nodes: int
    world: int
    shard: int
    cfg: TrainConfig  # auto settings resolved
    gpu_gib: float
    gpu_capacity_gib: int
    host_gib: float  # per node, while loading
    host_capacity_gib: int  # the GPUs' share of the node's host memory
    speed: Speed
    steps: int  # optimizer steps of the whole run
    training_hours: float  # the steps alone
    overheads: Overheads
    hours: float  # the steps and the overheads
    gpu_hours: float
    cost_usd: float | None  # None without an On-Demand price

    @property
    def fits_gpu(self) -> bool:
        return fits(self.gpu_gib, self.gpu_capacity_gib)

    @property
    def fits_host(self) -> bool:
        return self.host_gib <= HOST_FIT_FRACTION * self.host_capacity_gib

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host


@dataclass(frozen=True, kw_only=True)
class Refusal:
    reason: str
    fix: str  # the change, as matrix keys, and what it gives; "" when no change tried fits
    fix_key: str = ""  # the run path the fix changes first ("nodes", "trainer.training.batch_size_per_gpu")


@dataclass(frozen=True, kw_only=True)
class RunEstimate:
    name: str
    cluster: str
    model: str
    instance_type: str
    region: str
    reserved: bool  # the cluster runs on capacity reservations
    figures: Figures
    refusal: Refusal | None
    # What makes the run this run, flattened to dotted keys: compared by `--plan --base`.
    settings: dict[str, object]


def host_gib_per_node(arch: Architecture, shard: int, gpus_per_node: int) -> float:
    largest = max(arch.vocab_size * arch.hidden_size, arch.intermediate_size * arch.hidden_size) * 4
    per_rank = RANK_HOST_BASE_GIB + (arch.num_params * 2 / shard + largest) / GIB
    return gpus_per_node * per_rank


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a run's overheads depend on beyond its configuration."""

    shared_storage_gib: int  # the cluster's shared volume
    downloads_model: bool  # the first run of its model on its cluster
    stages_data: bool  # the first run of its dataset on its cluster
    rates: CheckpointRates


def figures(
    arch: Architecture,
    cfg: TrainConfig,
    instance: InstanceType,
    nodes: int,
    gpus: int,
    dataset_tokens: int | None,
    price: float | None,
    context: Context,
) -> Figures:
    """Estimate one configuration; `cfg` may still hold `auto` settings (resolved here)."""
    world = nodes * gpus
    shard = check_topology(cfg.parallelism, world, gpus)
    cfg = resolve_auto(arch, cfg, shard, instance.gpu_memory_gib)
    speed = predict(arch, cfg, Topology(nodes=nodes, gpus_per_node=gpus, shard=shard), hardware(instance))
    tr = cfg.training
    if tr.max_steps:
        steps = tr.max_steps
    elif dataset_tokens is not None:
        steps = tr.num_epochs * steps_per_epoch(dataset_tokens, cfg, world)
    else:
        steps = 0
    spent = overheads(
        arch,
        cfg,
        world=world,
        shard=shard,
        step_s=speed.step_s,
        steps=steps,
        shared_storage_gib=context.shared_storage_gib,
        downloads_model=context.downloads_model,
        stages_data=context.stages_data,
        dataset_tokens=dataset_tokens,
        rates=context.rates,
    )
    training_hours = steps * speed.step_s / 3600 if steps else float("nan")
    hours = training_hours + spent.total_s / 3600
    return Figures(
        nodes=nodes,
        world=world,
        shard=shard,
        cfg=cfg,
        gpu_gib=estimate_peak_gib(arch, cfg, shard),
        gpu_capacity_gib=instance.gpu_memory_gib,
        host_gib=host_gib_per_node(arch, shard, gpus),
        host_capacity_gib=instance.host_memory_gib * gpus // instance.num_gpus,
        speed=speed,
        steps=steps,
        training_hours=training_hours,
        overheads=spent,
        hours=hours,
        gpu_hours=hours * world,
        cost_usd=None if price is None or math.isnan(hours) else hours * nodes * price,
    )


def _replace(cfg: TrainConfig, section: str, **changes: object) -> TrainConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})


def unresolved_config(cfg: TrainConfig, run: Run) -> TrainConfig:
    """The run's config with the settings the matrix left to `auto` back at auto, so a changed run
    resolves them again."""
    changes = {}
    for key in ("activation_checkpointing", "grad_sync"):
        if f"trainer.parallelism.{key}" not in run.sources:
            changes[key] = "auto"
    return _replace(cfg, "parallelism", **changes) if changes else cfg


Candidate = tuple[str, int, TrainConfig]  # the change as matrix keys, nodes, config


def _group_sizes(group: int, world: int) -> list[int]:
    """HYBRID_SHARD shard groups larger than `group`: doubling, up to the world, dividing it."""
    sizes, size = [], group * 2
    while size <= world:
        if world % size == 0:
            sizes.append(size)
        size *= 2
    return sizes


def fit_candidates(
    cfg: TrainConfig, nodes: int, gpus: int, max_nodes: int, fp8_capable: bool = True
) -> list[list[Candidate]]:
    """The changes that may make a run fit, by family, each family from the least change to the most.
    `cfg` holds the matrix's settings with `auto` unresolved: checkpointing changes only where the
    matrix fixed a mode (`auto` already chose the most it can). fp8 only where the GPU has float8
    tensor cores (`fp8_capable`): elsewhere the planner refuses it."""
    par, tr = cfg.parallelism, cfg.training
    hybrid = par.sharding_strategy == "HYBRID_SHARD"
    group = par.shard_group_size or gpus
    more_nodes: list[Candidate] = []
    for n in range(nodes + 1, max_nodes + 1):
        more_nodes.append((f"nodes: {n}", n, cfg))
        # More nodes alone leave a HYBRID_SHARD group as it is: grow the group with them.
        more_nodes += [
            (
                f"nodes: {n}, trainer.parallelism.shard_group_size: {size}",
                n,
                _replace(cfg, "parallelism", shard_group_size=size),
            )
            for size in (_group_sizes(group, n * gpus) if hybrid else [])
        ]
    order = ("none", "selective", "full")
    checkpointing = [
        (
            f"trainer.parallelism.activation_checkpointing: {mode}",
            nodes,
            _replace(cfg, "parallelism", activation_checkpointing=mode),
        )
        for mode in (
            order[order.index(par.activation_checkpointing) + 1 :] if par.activation_checkpointing in order else ()
        )
    ]
    if hybrid:
        sharding = [
            (
                f"trainer.parallelism.shard_group_size: {size}",
                nodes,
                _replace(cfg, "parallelism", shard_group_size=size),
            )
            for size in _group_sizes(group, nodes * gpus)
        ]
    elif par.sharding_strategy in ("NO_SHARD", "SHARD_GRAD_OP"):
        sharding = [
            (
                "trainer.parallelism.sharding_strategy: FULL_SHARD",
                nodes,
                _replace(cfg, "parallelism", sharding_strategy="FULL_SHARD"),
            )
        ]
    else:
        sharding = []
    fp8 = (
        [
            (
                "trainer.parallelism.precision: fp8, trainer.parallelism.fp8_all_gather: true",
                nodes,
                _replace(cfg, "parallelism", precision="fp8", fp8_all_gather=True),
            )
        ]
        if par.precision == "bf16" and fp8_capable
        else []
    )
    smaller_batch: list[Candidate] = []
    for batch in range(tr.batch_size_per_gpu - 1, 0, -1):
        if tr.batch_size_per_gpu % batch == 0:
            accum = tr.grad_accum_steps * tr.batch_size_per_gpu // batch
            smaller_batch.append(
                (
                    f"trainer.training.batch_size_per_gpu: {batch}, trainer.training.grad_accum_steps: "
                    f"{accum} (the same global batch)",
                    nodes,
                    _replace(cfg, "training", batch_size_per_gpu=batch, grad_accum_steps=accum),
                )
            )
        else:
            smaller_batch.append(
                (
                    f"trainer.training.batch_size_per_gpu: {batch}",
                    nodes,
                    _replace(cfg, "training", batch_size_per_gpu=batch),
                )
            )
    return [more_nodes, checkpointing, sharding, fp8, smaller_batch]


def _reason(model: str, f: Figures, instance: InstanceType) -> str:
    par = f.cfg.parallelism
    if not f.fits_gpu:
        mode = par.activation_checkpointing
        checkpointing = "no activation checkpointing" if mode == "none" else f"{mode} activation checkpointing"
        return (
            f"{model} needs about {f.gpu_gib:.0f} GiB per GPU with {par.sharding_strategy} over {f.shard} GPUs "
            f"and {checkpointing}, but {instance.name} GPUs have "
            f"{usable_text(instance.gpu_memory_gib)}"
        )
    return (
        f"loading needs about {f.host_gib:.0f} GiB of host memory per node, more than "
        f"{HOST_FIT_FRACTION:.0%} of the {f.host_capacity_gib} GiB of {instance.name}"
    )


def refusal_text(refusal: Refusal) -> str:
    """The reason and the cheapest fix, as one sentence pair."""
    fix = refusal.fix or "none of more nodes, checkpointing, a larger shard group, fp8 or a smaller batch fits"
    return f"{refusal.reason}. Cheapest fix: {fix}."


def _price_of(f: Figures) -> float:
    return f.cost_usd if f.cost_usd is not None else f.gpu_hours


def hourly_price(matrix: Matrix, cluster: Cluster, instance_type: str, prices: PriceTable) -> float | None:
    """The On-Demand price of the instance type in the cluster's region; None only for a cluster on
    capacity reservations (billed by the reservation). A missing price is bad input."""
    where = f"cluster {cluster.name} ({matrix.file}:{cluster.lines.get('region', 0)})"
    row = prices.lookup(instance_type, cluster.region)
    if row is None:
        raise InputError(
            f"no price for {instance_type} in {cluster.region}, which {where} runs",
            file=prices.file,
            key="prices",
            fix=f"add a row {{instance_type: {instance_type}, region: {cluster.region}, "
            "usd_per_hour: ..., read: YYYY-MM-DD, source: ...}",
        )
    if row.usd_per_hour is None and not cluster.capacity_reservation_ids:
        raise InputError(
            f"{instance_type} in {cluster.region} has no On-Demand price ({row.source}), and {where} "
            "has no capacity reservation",
            file=prices.file,
            line=row.line,
            key="prices",
            fix=f"set clusters.{cluster.name}.capacity_reservation_ids, or write the price in this row",
        )
    return row.usd_per_hour


def estimate_run(
    matrix: Matrix,
    plan: Plan,
    prices: PriceTable,
    dataset_tokens: int | None,
    *,
    downloads_model: bool = True,
    stages_data: bool = True,
    rates: CheckpointRates | None = None,
) -> RunEstimate:
    """One planned run (planned without rejecting what does not fit)."""
    cluster = matrix.clusters[plan.cluster]
    instance = INSTANCE_TYPES[plan.instance_type]
    arch = MODELS[plan.model]
    usd = hourly_price(matrix, cluster, plan.instance_type, prices)
    base = unresolved_config(plan.trainer, plan.run)
    context = Context(
        shared_storage_gib=cluster.shared_storage_gib,
        downloads_model=downloads_model,
        stages_data=stages_data,
        rates=rates if rates is not None else read_checkpoint_rates(),
    )
    f = figures(arch, base, instance, plan.nodes, plan.gpus_per_node, dataset_tokens, usd, context)
    refusal = None
    if not f.fits:
        best: tuple[float, str, Figures] | None = None
        fp8_capable = instance.compute_capability >= FP8_MIN_COMPUTE_CAPABILITY
        for family in fit_candidates(base, plan.nodes, plan.gpus_per_node, cluster.max_nodes, fp8_capable):
            for label, nodes, cfg in family:
                try:
                    g = figures(arch, cfg, instance, nodes, plan.gpus_per_node, dataset_tokens, usd, context)
                except ConfigError:
                    continue
                if not g.fits:
                    continue
                # The least change of a family that fits stands for the family. Within 1% the
                # earlier family wins: costs that close are the model's noise, not a saving.
                if best is None or _price_of(g) < best[0] * (1 - COST_TIE):
                    best = (_price_of(g), label, g)
                break
        fix = fix_key = ""
        if best is not None:
            _, label, g = best
            cost = f"${g.cost_usd:,.0f}" if g.cost_usd is not None else f"{g.gpu_hours:,.0f} GPU-hours"
            fix = f"{label} (about {g.gpu_gib:.0f} GiB per GPU, {cost})"
            fix_key = label.split(":", 1)[0]  # every label is "key: value[, key: value]"
        refusal = Refusal(reason=_reason(plan.model, f, instance), fix=fix, fix_key=fix_key)
    return RunEstimate(
        name=plan.name,
        cluster=plan.cluster,
        model=plan.model,
        instance_type=plan.instance_type,
        region=cluster.region,
        reserved=bool(cluster.capacity_reservation_ids),
        figures=f,
        refusal=refusal,
        settings=settings_of(plan),
    )


def plan_fitting(matrix: Matrix, runs: Sequence[Run]) -> list[ClusterPlan]:
    """plan(): every run planned (the first bad one raises InputError), where a run that does not fit
    is refused with the reason and the cheapest change that fits, the ones `--plan` gives it, at the
    matrix line of the setting that change makes first (its entry's line where it sets nothing yet)."""
    try:
        return plan_clusters(matrix, runs)
    except Unfit as unfit:
        index = next(i for i, r in enumerate(runs) if r is unfit.run)
        raise _unfit_error(matrix, runs[: index + 1], unfit) from None


def _unfit_error(matrix: Matrix, runs: Sequence[Run], unfit: Unfit) -> InputError:
    """`unfit`, the last of `runs`, as --plan refuses it. The runs before it count as they do in
    --plan (the first run of a model and of a dataset on a cluster downloads and stages them: costs
    that rank the changes)."""
    try:
        est = estimate_matrix(matrix, plan_runs(matrix, runs, reject_unfit=False), load_prices()).runs[-1]
    except InputError:  # the price table cannot rank the changes (--plan says why)
        return unfit
    refusal = est.refusal
    if refusal is None:
        return unfit
    run = runs[-1]
    message = f"{refusal.reason} (run {est.name})"
    if not refusal.fix:
        line, key = where(matrix, run, "model")
        fix = (
            "none of more nodes, checkpointing, a larger shard group, fp8 or a smaller batch fits: "
            "use an instance type with more GPU memory or a smaller model"
        )
    else:
        line, key = where(matrix, run, refusal.fix_key)
        fix = f"set {refusal.fix}: the cheapest change that fits, as --plan shows"
    return InputError(message, file=matrix.file, line=line, key=key, fix=fix)


# Per-run paths carry the name (and so the hash): they differ whenever anything else does.
_NAMED_PATHS = ("trainer.checkpoint.dir", "trainer.metrics.output_dir")


def settings_of(plan: Plan) -> dict[str, object]:
    flat: dict[str, object] = {
        k: getattr(plan, k)
        for k in ("instance_type", "nodes", "gpus_per_node", "rdzv_backend", "active_deadline_s", "shm_size_gib")
    }

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif prefix not in _NAMED_PATHS:
            flat[prefix] = value

    walk("trainer", to_dict(plan.trainer))
    return flat


# Tokens per epoch of the datasets the matrix trains on (the trainer reads them on the cluster's
# shared volume, so the planner cannot count them): data.path -> (tokens, where the figure comes from).
# Replace an estimate with a count: `len(trainer.data.build_dataset(cfg, tokenizer, ...))` packed
# rows x seq_len on the file itself.
DATASET_TOKENS: dict[str, tuple[int, str]] = {
    "/shared/data/samsum/train.jsonl": (
        3_000_000,
        "an estimate: 14,732 SAMSum training dialogues x about 200 Llama tokens each (prompt "
        "template, dialogue, summary); not counted",
    ),
}


def dataset_tokens(cfg: TrainConfig) -> tuple[int | None, str]:
    """(tokens per epoch or None when unknown, where the figure comes from)."""
    data = cfg.data
    if data.format == "synthetic":
        return data.num_synthetic_samples * data.seq_len, "synthetic samples x seq_len"
    known = DATASET_TOKENS.get(data.path)
    if known is None:
        return None, f"{data.path}: token count unknown (add it to DATASET_TOKENS in generators/plan/estimate.py)"
    return known


@dataclass(frozen=True, kw_only=True)
class MatrixEstimate:
    matrix_file: str
    runs: tuple[RunEstimate, ...]
    notes: tuple[str, ...]  # what the figures assume, once each

    @property
    def refused(self) -> tuple[RunEstimate, ...]:
        return tuple(r for r in self.runs if r.refusal is not None)


def estimate_matrix(
    matrix: Matrix, plans: Sequence[Plan], prices: PriceTable, rates: CheckpointRates | None = None
) -> MatrixEstimate:
    """Every run (plans from plan_runs(..., reject_unfit=False)), in matrix order. The first run of a
    model (and of a dataset) on a cluster counts its download (and its staging)."""
    rates = rates if rates is not None else read_checkpoint_rates()
    out: list[RunEstimate] = []
    notes = {
        "Speed: the compute utilisation measured on one H200 for the same precision, compile and "
        f"checkpointing (benchmarks/results/); collectives at {NVLINK_EFFICIENCY:.0%} of NVLink (measured "
        f"between two H200s) and {NETWORK_EFFICIENCY:.0%} of the EFA line rate (not measured here). "
        "'uncalibrated' marks a run outside those measurements (a GPU, the network between nodes, or a "
        "precision and checkpointing cell never measured), and says which.": None
    }
    models_seen: set[tuple[str, str]] = set()
    data_seen: set[tuple[str, str]] = set()
    for plan in plans:
        tokens, source = dataset_tokens(plan.trainer)
        if not plan.trainer.training.max_steps:
            notes.setdefault(f"Dataset {plan.trainer.data.path or plan.trainer.data.format}: {source}.", None)
        model_key, data_key = (plan.cluster, plan.model), (plan.cluster, plan.trainer.data.path)
        est = estimate_run(
            matrix,
            plan,
            prices,
            tokens,
            downloads_model=model_key not in models_seen,
            stages_data=data_key not in data_seen,
            rates=rates,
        )
        models_seen.add(model_key)
        data_seen.add(data_key)
        speed_ = est.figures.speed
        if not speed_.basis.startswith("measured"):
            notes.setdefault(f"Speed on {est.instance_type}: {speed_.basis}.", None)
        out.append(est)
    async_runs = any(async_mode(p.trainer) in ASYNC_MODES for p in plans)
    for line in overhead_notes(rates, async_runs):
        notes.setdefault(line, None)
    used = sorted({(e.instance_type, e.region) for e in out})
    for instance_type, region in used:
        row = prices.lookup(instance_type, region)
        if row is not None:
            price = "no On-Demand price" if row.usd_per_hour is None else f"${row.usd_per_hour:,.2f} per hour"
            notes.setdefault(f"{instance_type} in {region}: {price}, read {row.read} ({row.source}).", None)
    apis = {c.name: c.job_api for c in matrix.clusters.values() if any(r.cluster == c.name for r in out)}
    if any(api != "pytorchjob" for api in apis.values()):
        # Only where a cluster leaves the default: the seed plan stays as it is.
        named = ", ".join(
            f"{c} {'TrainJob (Kubeflow Trainer v2)' if a == 'trainjob' else 'PyTorchJob'}" for c, a in apis.items()
        )
        notes.setdefault(f"Job API per cluster: {named}; the figures do not depend on it (docs/job-api.md).", None)
    return MatrixEstimate(matrix_file=matrix.file, runs=tuple(out), notes=tuple(notes))


# ---------------------------------------------------------------------------------------------------
# Rendering: Markdown that reads as plain text too (a pull-request comment and a terminal)
