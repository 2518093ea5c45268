"""Predicted speed of a training run: step time, tokens/s per GPU and hours, before it runs.

Pure Python, no torch; the planner (`expand.py --plan`) and the scaling report use it. Per optimizer
step and GPU (P parameters, L layers, h hidden size, V vocabulary, s sequence length, S the shard
group, W the world size, G GPUs per node, N nodes):

compute    t_c = T x (F_m / u_m + F_a / u_a) / peak. T = batch x seq_len x grad_accum_steps tokens.
           F_m + F_a is what one token really costs, in the matrix multiplications of the weights
           (F_m: the 6 x parameters MFU counts, trainer.catalog flops_per_token, plus the output
           layer, 6 V h, which MFU leaves out) and in attention (F_a: 12 L h s by the MFU
           convention, which counts the whole score matrix, times the causal share the kernels
           compute: FlashAttention and cuDNN skip the tiles above the diagonal, so of n = s / 128
           tile rows they compute (n + 1) / 2n of the tiles, about half). Activation
           checkpointing adds the forward pass it recomputes (2 x decoder parameters + the causal
           4 h s per token for every layer with `full`, every Nth with `selective`). peak is the
           GPU's dense bf16 peak (trainer.catalog). u is measured: the utilisation of one H200 for
           the same precision, compile setting and checkpointing mode (CALIBRATION, from
           benchmarks/results/); with fp8 only the weights' matrix multiplications are float8, so
           attention keeps the bf16 figure (u_a) and the calibration run sets u_m.
optimizer  t_o = P / S x B / HBM bandwidth: the update is memory-bound. B = 36 bytes per parameter
           with fp32 AdamW moments (read parameter, gradient and both moments, write three, read the
           gradient again for the clipping norm and zero it), 28 with bf16 moments.
parameters t_p = P x B_p / HBM bandwidth: what every step does to every parameter besides the update,
           whatever the batch: FSDP's casts and copies of the gathered layers in forward and backward
           and of the gradients it reduces, and with fp8 the float8 casts of the weights. B_p
           (PARAMETER_PASS_BYTES) is fitted per precision to two batch sizes measured in one lease
           (one H200; Llama-2-7B batch 2 and batch 3 or 4): without it the model credited a larger
           batch with the optimizer's time alone and under-predicted batch 3-4 by 7-10%.
traffic    bytes each GPU sends per step (d = 2 bytes bf16 parameters, 1 for fp8-gathered decoder
           weights; gradients reduced in fp32, 4 bytes; k micro-batches per step):
           FULL_SHARD     all-gather forward and backward, reduce-scatter:  (2k d + r 4) P (S-1)/S
           SHARD_GRAD_OP  all-gather once per micro-batch, reduce-scatter:  (k d + r 4) P (S-1)/S
           HYBRID_SHARD   FULL_SHARD within the group of S, then an all-reduce of each gradient
                          shard across the W/S groups:  2 (R-1)/R x r 4 P / S, R = W / S
           NO_SHARD       all-reduce of every gradient:  2 (W-1)/W x r 4 P
           with r = 1 reduction per step (grad_sync last) or k (every).
links      a collective inside one node runs over NVLink (per direction, per GPU); one that spans
           nodes is bounded by the node's network: a ring over the whole world crosses each node
           boundary once, so a node sends what one GPU sends; HYBRID_SHARD's replica all-reduces
           run once per local rank, so a node sends G times a GPU's share. Both at an achieved
           fraction of the line rate (NVLINK_EFFICIENCY, measured; NETWORK_EFFICIENCY).
step       t = t_c + t_o + t_p + exposed. FSDP overlaps the collectives of one layer with the compute of
           another: forward all-gathers under the forward (a third of the FLOPs that are not
           recomputation), backward all-gathers and reductions under the backward. Exposed is what
           does not fit under its part, plus t_comm / L (the first all-gather and the last
           reduction of a step, which nothing overlaps), plus min(t_comm, t_c) x NCCL_CHANNELS /
           SMs (the SMs the collectives take from the compute they overlap).
epoch      the dataset's tokens (generators/plan/estimate.py DATASET_TOKENS) / seq_len packed
           rows, W x batch x k rows per step.

So scaling is predicted, not assumed: more GPUs shrink t_o and add traffic; across nodes the
network bandwidth of the instance type decides how much of it hides under the compute.

Calibrated or not: a prediction outside what was measured (a GPU other than the H200, collectives
over EFA between nodes, a precision, compile and checkpointing cell CALIBRATION lacks) says which in
Speed.uncalibrated, and the plan marks it. What this model does not see: stragglers, NCCL's
algorithm choices, compilation; the time to pull the image, load the weights and write checkpoints
is generators/plan/overheads.py's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from trainer.catalog import GPU_PEAK_FLOPS, INSTANCE_TYPES, MODELS, Architecture, InstanceType
from trainer.config import ConfigError, TrainConfig, check_topology, from_dict

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """What the speed model needs of one instance type, per GPU and per node."""

    gpu_model: str
    hbm_bytes_s: float  # HBM bandwidth per GPU
    nvlink_bytes_s: float  # NVLink bandwidth per GPU, one direction
    network_bytes_s: float  # EFA bandwidth per node, one direction
    sms: int  # streaming multiprocessors per GPU


# (GPU model, GPU memory GiB as the catalog has it) -> (HBM, NVLink per direction in bytes/s, SMs).
# Sources: NVIDIA A100 datasheet and whitepaper (HBM2 1,555 GB/s for 40 GB, HBM2e 2,039 GB/s for
# 80 GB; NVLink 3 600 GB/s both directions; 108 SMs), H100 SXM datasheet and whitepaper (HBM3 3.35
# TB/s; NVLink 4 900 GB/s; 132 SMs), H200 datasheet (HBM3e 4.8 TB/s; NVLink 900 GB/s; the H100's 132
# SMs). The network per node is the catalog's (trainer/catalog.py).
GPU_FIGURES: dict[tuple[str, int], tuple[float, float, int]] = {
    ("A100", 40): (1555 * GB, 300 * GB, 108),
    ("A100", 80): (2039 * GB, 300 * GB, 108),
    ("H100", 80): (3350 * GB, 450 * GB, 132),
    ("H200", 141): (4800 * GB, 450 * GB, 132),
}
# SMs an NCCL collective occupies while it overlaps compute: one per channel, and NCCL opened 24
# channels between two H200s (tests/data/nccl/nvlink-h200x2.log). Compute overlapped by a collective
# runs on the other SMs.
NCCL_CHANNELS = 24
# Achieved fractions of those line rates. NVLink: measured, an NCCL all-reduce of 256 MiB between two
# H200s reached 295.6 GB/s of bus bandwidth (benchmarks/results/h200x2-preflight.json), 66% of
# 450 GB/s. EFA: not measured here (no second node was lent); 80% is what NCCL's bus bandwidth
# typically reaches over EFA. HBM: the fused AdamW update streams at about 80% of the peak (not
# measured alone; the one-GPU calibration absorbs the difference).
NVLINK_EFFICIENCY = 295.6 / 450
NETWORK_EFFICIENCY = 0.8
HBM_EFFICIENCY = 0.8
REFERENCE_GPU = "H200"
# Causal attention as the kernels run it (FlashAttention 2/3 and cuDNN, SDPA's kernels on H100 and
# H200): the score matrix in tiles of ATTENTION_TILE query and key rows, the tiles wholly above the
# diagonal skipped.
ATTENTION_TILE = 128


def hardware(instance: InstanceType) -> Hardware:
    hbm, nvlink, sms = GPU_FIGURES[(instance.gpu_model, instance.gpu_memory_gib)]
    return Hardware(
        gpu_model=instance.gpu_model,
        hbm_bytes_s=hbm,
        nvlink_bytes_s=nvlink,
        network_bytes_s=instance.network_gbps / 8 * GB,
        sms=sms,
    )


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """One measured configuration the utilisation u is derived from (Llama-2-7B, sequence 4096,
    batch 2, one H200: the model's own prediction of that run then equals the measurement)."""

    gpu_model: str
    precision: str
    compile: bool
    checkpointing: str
    model: str
    seq_len: int
    batch_size_per_gpu: int
    bf16_optimizer_state: bool
    tokens_per_s_per_gpu: float
    source: str  # results file and line (1-based)
    fp8_recipe: str = "tensorwise"  # parallelism.fp8_recipe (fp8 only)


CALIBRATION: tuple[Calibration, ...] = (
    Calibration(
        gpu_model="H200",
        precision="bf16",
        compile=True,
        checkpointing="none",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=11096.0,
        source="benchmarks/results/h200x1-perf-llama2-7b.jsonl:1",
    ),
    Calibration(
        gpu_model="H200",
        precision="bf16",
        compile=True,
        checkpointing="selective",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=10089.0,
        source="benchmarks/results/h200x1-suite1.jsonl:5",
    ),
    Calibration(
        gpu_model="H200",
        precision="bf16",
        compile=True,
        checkpointing="full",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=9233.0,
        source="benchmarks/results/h200x1-suite1.jsonl:6",
    ),
    Calibration(
        gpu_model="H200",
        precision="bf16",
        compile=False,
        checkpointing="none",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=7738.0,
        source="benchmarks/results/h200x1-suite1.jsonl:4",
    ),
    Calibration(
        gpu_model="H200",
        precision="fp8",
        compile=True,
        checkpointing="none",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=14034.0,
        source="benchmarks/results/h200x1-perf-llama2-7b.jsonl:3",
    ),
    Calibration(
        gpu_model="H200",
        precision="fp8",
        compile=True,
        checkpointing="none",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=12076.0,
        source="benchmarks/results/h200x1-perf-llama2-7b.jsonl:5",
        fp8_recipe="rowwise",
    ),
    Calibration(
        gpu_model="H200",
        precision="bf16",
        compile=False,
        checkpointing="full",
        model="llama2-7b",
        seq_len=4096,
        batch_size_per_gpu=2,
        bf16_optimizer_state=False,
        tokens_per_s_per_gpu=7523.0,
        source="benchmarks/results/h200x1-suite1.jsonl:2",
    ),
)


def causal_share(seq_len: int) -> float:
    """Of the s x s score matrix, the share a causal kernel computes: n (n + 1) / 2 of n^2 tiles."""
    n = max(1, math.ceil(seq_len / ATTENTION_TILE))
    return (n + 1) / (2 * n)


def _recomputed_layers(arch: Architecture, checkpointing: str, selective_every: int) -> int:
    return {"none": 0, "full": arch.num_layers, "selective": arch.num_layers // selective_every}[checkpointing]


def matmul_flops_per_token(arch: Architecture, checkpointing: str, selective_every: int) -> float:
    """FLOPs of the weights' matrix multiplications per trained token, the output layer and
    recomputation included."""
    decoder = arch.num_params - arch.num_embedding_params
    counted = arch.num_params - arch.vocab_size * arch.hidden_size
    recomputed = _recomputed_layers(arch, checkpointing, selective_every) * 2.0 * decoder / arch.num_layers
    return 6.0 * counted + 6.0 * arch.vocab_size * arch.hidden_size + recomputed


def attention_flops_per_token(arch: Architecture, seq_len: int, checkpointing: str, selective_every: int) -> float:
    """FLOPs of causal attention (scores and values) per trained token as the kernels compute them:
    forward 4 h s per layer, backward twice that, recomputed layers once more, times causal_share."""
    layers = 3 * arch.num_layers + _recomputed_layers(arch, checkpointing, selective_every)
    return layers * 4.0 * arch.num_heads * arch.head_dim * seq_len * causal_share(seq_len)


def flops_per_token(arch: Architecture, seq_len: int, checkpointing: str, selective_every: int) -> float:
    """FLOPs one trained token costs, recomputation, the output layer and causal attention included."""
    return matmul_flops_per_token(arch, checkpointing, selective_every) + attention_flops_per_token(
        arch, seq_len, checkpointing, selective_every
    )


def optimizer_bytes_per_param(cfg: TrainConfig) -> float:
    return 28.0 if cfg.training.bf16_optimizer_state else 36.0


def optimizer_time_s(arch: Architecture, cfg: TrainConfig, shard: int, hw: Hardware) -> float:
    return arch.num_params / shard * optimizer_bytes_per_param(cfg) / (hw.hbm_bytes_s * HBM_EFFICIENCY)


# Bytes per parameter each step moves besides the update, whatever the batch (the `parameters` term
# above). Fitted on one H200 in one lease (benchmarks/results/h200x1-perf-llama2-7b.jsonl): bf16 from
# batch 2 (line 1) and batch 3 with bf16 moments (line 6), fp8 from batch 2 (line 3) and batch 4 with
# bf16 moments (line 8). fp32 has not been measured at two batch sizes: the bf16 figure.
PARAMETER_PASS_BYTES = {"bf16": 48.0, "fp8": 64.0, "fp32": 48.0}


# Attention's utilisation relative to the weights' matrix multiplications in bf16 (u_a / u_m), fitted
# to the sequence-length series (benchmarks/results/h200x1-seqlen.jsonl: 2,048 to 16,384 tokens,
# where attention's share of the FLOPs grows fourfold) together with the batch series above.
ATTENTION_RELATIVE = 0.65


def parameter_pass_time_s(arch: Architecture, cfg: TrainConfig, hw: Hardware) -> float:
    return arch.num_params * PARAMETER_PASS_BYTES[cfg.parallelism.precision] / (hw.hbm_bytes_s * HBM_EFFICIENCY)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Where a run's GPUs are: nodes x GPUs per node, and the shard group of its strategy."""

    nodes: int
    gpus_per_node: int
    shard: int

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class Speed:
    """A predicted step, per GPU."""

    tokens_per_step: int  # per GPU
    compute_s: float
    optimizer_s: float
    comm_s: float
    step_s: float
    utilisation: float  # of the weights' matrix multiplications (u_m)
    basis: str  # where u came from: the calibration run, or what was assumed
    # What of this prediction lies outside the measurements it is calibrated on (empty: calibrated).
    uncalibrated: tuple[str, ...] = ()

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_s


Utilisation = tuple[float, float]  # (u_m, u_a): weights' matrix multiplications, attention


def utilisation(
    gpu: str, precision: str, compile_: bool, mode: str, recipe: str = "tensorwise"
) -> tuple[Utilisation, str, tuple[str, ...]]:
    """((u_m, u_a), where they come from, what is not measured) for these settings. Measured where
    CALIBRATION has them; otherwise the reference GPU's (a GPU not measured), and a precision or
    compile setting not measured with this checkpointing mode scales the mode's bf16 compiled figures
    by what that setting changes without checkpointing (fp8 on one H200: 1.4 times bf16's u_m)."""

    # fp8's scaling recipe is part of its precision cell ("fp8", "fp8 rowwise"); bf16 has none.
    def cell(p: str, r: str) -> str:
        return f"{p} {r}" if p == "fp8" and r != "tensorwise" else p

    by_key = {(c.gpu_model, cell(c.precision, c.fp8_recipe), c.compile, c.checkpointing): c for c in CALIBRATION}
    precision = cell(precision, recipe)
    notes: list[str] = []
    outside: list[str] = []
    measured_gpu = gpu if any(c.gpu_model == gpu for c in CALIBRATION) else REFERENCE_GPU
    if measured_gpu != gpu:
        notes.append(f"{gpu} not measured, the utilisation of one {measured_gpu} with the same settings")
        outside.append(f"{gpu} GPU")
    exact = by_key.get((measured_gpu, precision, compile_, mode))
    if exact is not None:
        return utilisation_of(exact), "; ".join(notes) or f"measured ({exact.source})", tuple(outside)
    outside.append(f"{precision}{'' if compile_ else ' eager'} with {mode} checkpointing")
    base = utilisation_of(by_key[(measured_gpu, "bf16", True, mode)])
    setting = by_key.get((measured_gpu, precision, compile_, "none"))
    if setting is None:
        what = f"{precision}{'' if compile_ else ' with compile off'}" if precision != "bf16" else "compile off"
        notes.append(f"{what} not measured, bf16 compiled with {mode} checkpointing")
        return base, "; ".join(notes), tuple(outside)
    reference = utilisation_of(by_key[(measured_gpu, "bf16", True, "none")])
    changed = utilisation_of(setting)
    notes.append(
        f"{precision}{'' if compile_ else ', compile off'} with {mode} checkpointing not measured: "
        f"bf16 compiled with {mode}, times what it changes with none"
    )
    u = (base[0] * changed[0] / reference[0], base[1] * changed[1] / reference[1])
    return u, "; ".join(notes), tuple(outside)


@functools.cache
def utilisation_of(cal: Calibration) -> Utilisation:
    """(u_m, u_a) that make the model reproduce the calibration run on one GPU: one figure for both in
    bf16; with fp8, attention (bf16 kernels) at the bf16 figure of the same compile setting and
    checkpointing, and u_m what the rest of the measured step leaves."""
    arch = MODELS[cal.model]
    cfg = from_dict(
        {
            "model": {"name": cal.model},
            "data": {"format": "synthetic", "seq_len": cal.seq_len},
            "training": {
                "batch_size_per_gpu": cal.batch_size_per_gpu,
                "bf16_optimizer_state": cal.bf16_optimizer_state,
            },
            "parallelism": {
                "precision": cal.precision,
                "compile": cal.compile,
                "activation_checkpointing": cal.checkpointing,
                **({"fp8_recipe": cal.fp8_recipe} if cal.precision == "fp8" else {}),
            },
        }
    )
    hw = hardware_for_gpu(cal.gpu_model)
    assert hw is not None, f"no instance type of the catalog has the calibration's GPU {cal.gpu_model}"
    peak = GPU_PEAK_FLOPS[cal.gpu_model]
    tokens = cal.batch_size_per_gpu * cal.seq_len
    step = tokens / cal.tokens_per_s_per_gpu
    compute = step - optimizer_time_s(arch, cfg, 1, hw) - parameter_pass_time_s(arch, cfg, hw)
    every = cfg.parallelism.selective_ac_every
    matmul = tokens * matmul_flops_per_token(arch, cal.checkpointing, every)
    attention = tokens * attention_flops_per_token(arch, cal.seq_len, cal.checkpointing, every)
    if cal.precision == "bf16":
        u = (matmul + attention / ATTENTION_RELATIVE) / (peak * compute)
        return u, u * ATTENTION_RELATIVE
    u_a = utilisation(cal.gpu_model, "bf16", cal.compile, cal.checkpointing)[0][1]
    return matmul / (peak * (compute - attention / (peak * u_a))), u_a


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """Bytes one GPU sends per optimizer step, by collective."""

    gather_forward: float  # all-gathers of the shard group during forward
    gather_backward: float  # and during backward
    reduce: float  # reduce-scatters of the shard group (all-reduce of the world for NO_SHARD)
    across: float  # HYBRID_SHARD: all-reduces of the gradient shards across the groups


def traffic_bytes(arch: Architecture, cfg: TrainConfig, topo: Topology) -> Traffic:
    par, tr = cfg.parallelism, cfg.training
    P, W, S = arch.num_params, topo.world, topo.shard
    k = tr.grad_accum_steps
    reductions = 1 if (k == 1 or par.grad_sync == "last") else k
    if par.sharding_strategy == "NO_SHARD":
        return Traffic(gather_forward=0.0, gather_backward=0.0, reduce=2 * (W - 1) / W * reductions * 4 * P, across=0.0)
    d = 4 if par.precision == "fp32" else 2
    root = arch.num_embedding_params + arch.hidden_size
    gathered = ((P - root) * (1 if par.fp8_all_gather else d) + root * d) * k * (S - 1) / S
    replicas = W // S
    return Traffic(
        gather_forward=gathered,
        gather_backward=gathered if par.sharding_strategy != "SHARD_GRAD_OP" else 0.0,
        reduce=reductions * 4 * P * (S - 1) / S,
        across=2 * (replicas - 1) / replicas * reductions * 4 * P / S if replicas > 1 else 0.0,
    )


def link_times_s(traffic: Traffic, topo: Topology, hw: Hardware, strategy: str) -> tuple[float, float, float]:
    """(forward gathers, backward gathers + reductions, total) in seconds on the run's links."""
    nvlink = hw.nvlink_bytes_s * NVLINK_EFFICIENCY
    network = hw.network_bytes_s * NETWORK_EFFICIENCY
    G = topo.gpus_per_node
    # The shard group's rings (the whole world for NO_SHARD): NVLink inside a node; a ring over
    # several nodes crosses each node boundary once, so a node sends what one GPU sends.
    spans = (topo.world if strategy == "NO_SHARD" else topo.shard) > G
    group_bw = min(nvlink, network) if spans else nvlink
    # HYBRID_SHARD's replica all-reduces: one per local rank, so G of them share a node's network.
    across_bw = network / G if topo.nodes > 1 else nvlink
    forward = traffic.gather_forward / group_bw
    backward = (traffic.gather_backward + traffic.reduce) / group_bw + traffic.across / across_bw
    return forward, backward, forward + backward


def predict(arch: Architecture, cfg: TrainConfig, topo: Topology, hw: Hardware) -> Speed:
    """The predicted step of a run whose `auto` settings are resolved."""
    par, tr = cfg.parallelism, cfg.training
    mode = par.activation_checkpointing
    if mode == "auto":
        raise ValueError("resolve activation_checkpointing 'auto' before predicting")
    (u_m, u_a), basis, outside = utilisation(hw.gpu_model, par.precision, par.compile, mode, par.fp8_recipe)
    tokens = tr.batch_size_per_gpu * cfg.data.seq_len * tr.grad_accum_steps
    every = par.selective_ac_every
    per_token = flops_per_token(arch, cfg.data.seq_len, mode, every)
    compute = (
        tokens
        * (
            matmul_flops_per_token(arch, mode, every) / u_m
            + attention_flops_per_token(arch, cfg.data.seq_len, mode, every) / u_a
        )
        / GPU_PEAK_FLOPS[hw.gpu_model]
    )
    if topo.nodes > 1 and topo.world > topo.gpus_per_node:
        outside = outside + ("EFA network",)
    # Forward is a third of the FLOPs that are not recomputation; backward (with it) the rest.
    forward_share = flops_per_token(arch, cfg.data.seq_len, "none", 1) / 3 / per_token
    optimizer = optimizer_time_s(arch, cfg, topo.shard, hw) + parameter_pass_time_s(arch, cfg, hw)
    if topo.world > 1:
        forward, backward, comm = link_times_s(traffic_bytes(arch, cfg, topo), topo, hw, par.sharding_strategy)
    else:
        forward = backward = comm = 0.0
    # FSDP overlaps a layer's collectives with another layer's compute: forward gathers under the
    # forward, backward gathers and reductions under the backward. What does not fit is exposed, and
    # so are the first all-gather and the last reduction of a step (one layer's worth each); what
    # fits slows the compute it overlaps by the SMs NCCL takes.
    exposed = (
        max(0.0, forward - compute * forward_share)
        + max(0.0, backward - compute * (1 - forward_share))
        + comm / arch.num_layers
        + min(comm, compute) * NCCL_CHANNELS / hw.sms
    )
    return Speed(
        tokens_per_step=tokens,
        compute_s=compute,
        optimizer_s=optimizer,
        comm_s=comm,
        step_s=compute + optimizer + exposed,
        utilisation=u_m,
        basis=basis,
        uncalibrated=outside,
    )


def steps_per_epoch(dataset_tokens: int, cfg: TrainConfig, world: int) -> int:
    rows = math.ceil(dataset_tokens / cfg.data.seq_len)
    return max(1, math.ceil(rows / (world * cfg.training.batch_size_per_gpu * cfg.training.grad_accum_steps)))


def hardware_for_gpu(device_name: str) -> Hardware | None:
    """The figures of a GPU named as torch names it ('NVIDIA H200'): those of the first instance type
    of the catalog with that GPU; None if none has it (a CPU)."""
    upper = device_name.upper()
    for instance in INSTANCE_TYPES.values():
        if instance.gpu_model in upper:
            return hardware(instance)
    return None


def predict_measured(
    config: dict, world_size: int, local_world_size: int, device_name: str, one_host: bool = False
) -> float | None:
    """Predicted tokens/s per GPU of a measured configuration: a benchmark record's flat `config`
    (benchmarks/common.py: model, seq_len, batch_size_per_gpu, grad_accum_steps, parallelism.*,
    training.*) or a trainer run's resolved config (run.json). `local_world_size` GPUs per launch
    agent; `one_host`: every agent on one host (NVLink between them, as benchmarks/suite.py --nodes
    runs). None where the model does not apply: an unknown device (CPU), a configuration that is not
    the trainer's (the FSDP1 baseline)."""
    hw = hardware_for_gpu(device_name)
    if hw is None or local_world_size < 1 or world_size % local_world_size:
        return None
    if one_host:
        hw = dataclasses.replace(hw, network_bytes_s=hw.nvlink_bytes_s)
    if "parallelism" in config:  # a trainer run's nested config
        nested = {k: v for k, v in config.items() if k in ("model", "data", "training", "parallelism")}
    elif "parallelism.sharding_strategy" in config:
        nested = {
            "model": {"name": config.get("model")},
            "data": {"format": "synthetic", "seq_len": config.get("seq_len")},
            "training": {
                "batch_size_per_gpu": config.get("batch_size_per_gpu"),
                "grad_accum_steps": config.get("grad_accum_steps", 1),
            },
            "parallelism": {},
        }
        for key, value in config.items():
            section, _, leaf = key.partition(".")
            if section in ("parallelism", "training") and leaf:
                nested[section][leaf] = value
    else:
        return None
    try:
        cfg = from_dict(nested)
        arch = MODELS[cfg.model.name]
        nodes = world_size // local_world_size
        shard = check_topology(cfg.parallelism, world_size, local_world_size)
        if cfg.parallelism.activation_checkpointing == "auto" or (
            cfg.parallelism.grad_sync == "auto" and cfg.training.grad_accum_steps > 1
        ):
            return None
        return predict(
            arch, cfg, Topology(nodes=nodes, gpus_per_node=local_world_size, shard=shard), hw
        ).tokens_per_s_per_gpu
    except (ConfigError, KeyError, TypeError, ValueError):
        return None
