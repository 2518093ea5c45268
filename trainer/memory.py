"""Peak GPU memory estimate of a training run, and the `auto` activation-checkpointing choice.

One model serves the generator (which rejects runs that cannot fit and writes the resolved
checkpointing mode into each run's config) and the trainer (which resolves `auto` at start from the
real device's memory), so both choose the same way. Pure Python, no torch.

The estimate is the peak of what PyTorch's caching allocator hands out (torch.cuda.max_memory_allocated,
the `peak_allocated_gib` of benchmarks/results). What lies outside it (the allocator's cache, the CUDA
context, NCCL's buffers) is the headroom `fits` adds (HEADROOM_GIB).

Per GPU, in bytes: P parameters, L decoder layers, T = b x s tokens per micro-batch, h hidden size, kv
KV width, i intermediate size, V vocabulary, d = 2 for bf16 and fp8 or 4 for fp32, S the shard group;
the root (embeddings, final norm, lm_head) has R = 2Vh + h parameters, a decoder layer (P - R) / L.
- Resident through the step: fp32 parameters and AdamW moments, P x (4 + 8) / S, P x (4 + 4) / S with
  bf16 moments; with gradient accumulation, also the gradients held across micro-batches: 4 P
  unsharded fp32 when only the last micro-batch reduces, else the sharded 4 P / S.
- Saved activations of a decoder layer that keeps them, T x a x d, `a` counted from the tensors the
  layer saves for backward (torch 2.11, transformers 5.17, torchao 0.17, sdpa attention):
  compiled bf16, 6h + 2kv + 3i: the layer input, both norm outputs, q, k, v, the attention output and
  its copy in o_proj's layout, gate, up and their SwiGLU product; compiled fp8, 4h + 2kv + 2i: the graph
  keeps the layer input, the residual after attention, q, k, v, the attention output, gate and up, and
  recomputes the float8 linears' inputs from them in backward; eager, 10h + 2kv + 4i: the norms keep
  fp32 copies, SwiGLU also silu(gate) (torchao's eager float8 linears save their bf16 inputs, so fp8
  saves as much). Eager attention adds its softmax probabilities, heads x s x (4 + d) per token. A
  checkpointed layer keeps its input, T x h x d, and recomputes the rest in its backward; the final
  norm keeps T x h x (4 + d).
- Backward walks the layers from the last to the first, freeing a layer's activations as it adds its
  gradients, so the peak is at one of three moments, each with the gathered root (R x d; decoder
  weights are gathered in 1 byte with the fp8 all-gather):
  1. the loss at the end of forward: every activation, the last layer still gathered (every layer with
     SHARD_GRAD_OP and NO_SHARD, which keep them from forward to backward), and the loss's working set.
     Chunked: one chunk's fp32 logits and their bf16 gradient, min(T, chunk) x V x (4 + d); the fp32
     lm_head gradient it accumulates and the next chunk's part, 2 x 4 V h (one with one chunk); the
     hidden states' gradient, T x h x d. Full: three T x V fp32 tensors in its backward (the saved
     log-softmax, its gradient and the logits' gradient).
  2. the start of backward: every activation, lm_head's unsharded gradient (V h d), two gathered layers
     (current and prefetched; all of them with SHARD_GRAD_OP and NO_SHARD) and the layer's backward:
     its unsharded gradients (layer x d), the previous layer's fp32 reduce-scatter input (layer x 4,
     kept until the next reduce-scatter), its gradient temporaries T x (2h + 3i) x d and, for a
     checkpointed layer, its recomputed activations.
  3. the end of backward: the fp32 gradients of every layer but the first (4 / S each; with gradient
     accumulation they are resident already) with the first layer's backward as in 2; or, once that is
     done, every gradient and the root's reduce-scatter, which holds the root's unsharded gradients and
     their fp32 copy: R x (4 + max(d, 4 / S)) besides the 4 P / S.

Against every trainer run measured on H200s (benchmarks/results/*.jsonl: Llama-2-7B, Llama-2-13B and
Llama-3.1-8B, sequence 2048 to 16384, checkpointing none, selective and full, compiled and eager, bf16
and fp8, FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD on one and two GPUs) the estimate is within -1% and
+2% of the peak allocated, e.g. Llama-2-7B at 8,192 tokens on one H200: 110.9 against 110.4 GiB without
checkpointing, 102.6 against 102.4 with selective and 102.6 against 102.2 with full. One run is under
it by more: with the float8 all-gather a compiled layer also saves float8 copies of its MLP and output
projection weights for backward (3hi + h^2 bytes, counted among the tensors it saves with torch's
float8 matmul), 4.5 GiB for Llama-2-7B that the estimate leaves out (63.5 against 67.9 GiB on two
H200s, -6.6%).

Two bounds, both from what H200 runs held beyond the peak the estimate counts:
- `fits` (the generator refuses a run, and `auto` falls back to full checkpointing, beyond it): the
  estimate plus HEADROOM_GIB within the GPU's memory. HEADROOM_GIB is ALLOCATOR_GAP_GIB, the largest
  gap between reserved and allocated memory measured with full checkpointing and the default chunked
  loss (7.9 GiB, Llama-3.1-8B on one H200: 131.5 reserved against 123.6 allocated), plus
  OUTSIDE_ALLOCATOR_GIB for the CUDA context, NCCL's buffers and the part of the nominal capacity the
  driver keeps (the highest reserved of a run that completed, 138.5 GiB of the H200's 140.4 visible,
  141 nominal). Every configuration
  measured on an H200 is within it; Llama-3.1-8B at sequence 4096, batch 2 with full checkpointing
  (123.6 GiB) fits the 141 GiB H200 with 7 GiB to spare.
- `auto`'s preference: a mode that keeps activations (none, selective) only where its estimate stays
  within AUTO_FRACTION, 90%, of the GPU's memory less AUTO_HEADROOM_GIB, 8 GiB. With activations kept,
  the allocator's cache grows far more above the peak (18 to 28 GiB measured), and near capacity it
  frees and retries, which costs more than the recomputation saves: Llama-3.1-8B with selective
  checkpointing (peak 123.6 GiB, 138.5 GiB reserved) ran at 8,159 tokens/s, slower than with full
  checkpointing (8,596 at the same peak, 131.5 GiB reserved); Llama-2-7B without checkpointing
  (110.4 GiB) was the fastest mode. So `auto` picks none, then selective (every `selective_ac_every`th
  layer) within that preference, else full.
"""

from __future__ import annotations

import dataclasses

from trainer.catalog import Architecture
from trainer.config import TrainConfig

GIB = 1024**3
# A run fits when its estimated peak plus HEADROOM_GIB stays within the GPU's memory (see above).
# ALLOCATOR_GAP_GIB: peak_reserved_gib - peak_allocated_gib of benchmarks/results/h200x1-perf-llama3.1-8b.jsonl:2
# (7.89 GiB, Llama-3.1-8B fp8; 7.84 in bf16, h200x1-llama31-8b-loss.jsonl:2), the largest of the runs with full
# checkpointing and the chunked loss, the trainer's default (3.8 GiB for Llama-2-7B, h200x1-suite1.jsonl:6).
# With the full-logits loss the allocator kept freed logits too, 14.7 GiB above the same peak (138.3
# reserved, h200x1-extra.jsonl:2), at the same speed (8,561 against 8,596 tokens/s): a cache it takes
# where there is room, not one it needs.
ALLOCATOR_GAP_GIB = 7.9
ALLOCATOR_GAP_SOURCE = "benchmarks/results/h200x1-perf-llama3.1-8b.jsonl:2"
# CUDA context and NCCL's buffers (outside the caching allocator) and the nominal capacity the driver
# keeps: runs reserved up to 138.5 GiB of the 140.4 GiB an H200 shows (141 nominal in the catalog).
OUTSIDE_ALLOCATOR_GIB = 2.5
HEADROOM_GIB = ALLOCATOR_GAP_GIB + OUTSIDE_ALLOCATOR_GIB
# `auto` keeps activations (none, selective) only within AUTO_FRACTION of the GPU less AUTO_HEADROOM_GIB.
AUTO_FRACTION = 0.90
AUTO_HEADROOM_GIB = 8.0
AUTO_ORDER = ("none", "selective", "full")


def state_bytes_per_param(bf16_optimizer_state: bool) -> int:
    """Bytes each parameter keeps through training: its fp32 copy and two AdamW moments (fp32, or bf16
    with training.bf16_optimizer_state). Resident per GPU over the shard group, and the bulk of every
    checkpoint (trainer/storage.py)."""
    return 4 + (2 + 2 if bf16_optimizer_state else 4 + 4)


def _saved_per_token(arch: Architecture, cfg: TrainConfig) -> int:
    """Elements a decoder layer that keeps its activations saves for backward, per token (see above)."""
    h, i = arch.hidden_size, arch.intermediate_size
    kv = arch.num_kv_heads * arch.head_dim
    par = cfg.parallelism
    if not par.compile:
        return 10 * h + 2 * kv + 4 * i
    if par.precision == "fp8":
        return 4 * h + 2 * kv + 2 * i
    return 6 * h + 2 * kv + 3 * i


def estimate_peak_gib(
    arch: Architecture, cfg: TrainConfig, shard: int, ac_mode: str | None = None, grad_sync: str | None = None
) -> float:
    """Estimated peak allocated memory per GPU in GiB; `ac_mode` and `grad_sync` override the config's."""
    P, L, h, V = arch.num_params, arch.num_layers, arch.hidden_size, arch.vocab_size
    par, tr = cfg.parallelism, cfg.training
    mode = ac_mode or par.activation_checkpointing
    if mode == "auto":
        raise ValueError("resolve activation_checkpointing 'auto' before estimating")
    # fp8 keeps bf16 parameters, gathered weights and gradients (the float8 casts are transient); with
    # the float8 all-gather the gathered decoder weights are 1 byte.
    d = 4 if par.precision == "fp32" else 2
    d_gathered = 1 if par.fp8_all_gather else d
    S = shard
    resident = P * state_bytes_per_param(tr.bf16_optimizer_state) / S
    # An unresolved grad_sync 'auto' counts as 'every'; resolve_auto decides it before the estimate.
    # Gradients of the earlier micro-batches live through the later ones' activations: unsharded fp32
    # of every parameter when only the last micro-batch reduces, else the sharded ones. Measured on two
    # H200s (Llama-2-7B, 4 micro-batches): +25.1 GiB (= 4 P) and +12.6 GiB (= 4 P / 2).
    accumulating = tr.grad_accum_steps > 1
    if accumulating:
        resident += P * 4 if (grad_sync or par.grad_sync) == "last" else P * 4 / S
    # Sharded fp32 gradients that backward adds (already resident when accumulating).
    grad_bytes = 0.0 if accumulating else 4 / S

    root = arch.num_embedding_params + h
    layer = (P - root) / L
    lm_head = V * h
    tokens = tr.batch_size_per_gpu * cfg.data.seq_len

    # Saved activations.
    kept = tokens * _saved_per_token(arch, cfg) * d
    if cfg.model.attn_implementation == "eager":
        kept += tokens * arch.num_heads * cfg.data.seq_len * (4 + d)
    checkpointed = tokens * h * d
    n_checkpointed = {"none": 0, "full": L}.get(mode, L // par.selective_ac_every)
    acts = n_checkpointed * checkpointed + (L - n_checkpointed) * kept + tokens * h * (4 + d)
    # Backward starts with the last layer, recomputing it first where it is checkpointed.
    top_recomputed = kept if mode == "full" or (mode == "selective" and L % par.selective_ac_every == 0) else 0

    # Gathered weights: FULL_SHARD / HYBRID_SHARD reshard each layer after forward and after backward;
    # SHARD_GRAD_OP and NO_SHARD keep every layer gathered from its forward to its backward.
    reshard = par.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
    all_layers = (P - root) * d_gathered
    root_gathered = root * d

    # 1. The loss, at the end of forward.
    if tr.loss_impl == "chunked":
        rows = min(tokens, tr.loss_chunk_size)
        loss = rows * V * (4 + d) + lm_head * 4 * (2 if tokens > rows else 1) + tokens * h * d
    else:
        loss = tokens * V * 4 * 3
    loss_end = acts + root_gathered + (layer * d_gathered if reshard else all_layers) + loss

    # 2. The start of backward, in the last layer.
    layer_backward = layer * d + layer * 4 + tokens * (2 * h + 3 * arch.intermediate_size) * d
    backward_start = (
        acts
        + root_gathered
        + lm_head * d
        + (2 * layer * d_gathered if reshard else all_layers)
        + layer_backward
        + top_recomputed
    )

    # 3. The end of backward: the first layer's backward, then the root's reduce-scatter.
    first_layer = (
        (P - root - layer) * grad_bytes + root_gathered + lm_head * d + layer * d_gathered + layer_backward + kept
    )
    root_reduce = (P - root) * grad_bytes + root * (4 + max(d, 4 / S))
    backward_end = max(first_layer, root_reduce)

    return (resident + max(loss_end, backward_start, backward_end)) / GIB


def usable_gib(gpu_memory_gib: float) -> float:
    """The part of a GPU's memory an estimate may fill: all of it less HEADROOM_GIB."""
    return gpu_memory_gib - HEADROOM_GIB


def usable_text(gpu_memory_gib: float) -> str:
    """How refusals name the bound, e.g. "80 GiB (69.6 usable: 10.4 GiB of headroom, ...)"."""
    return (
        f"{gpu_memory_gib:g} GiB ({usable_gib(gpu_memory_gib):.1f} usable: {HEADROOM_GIB:.1f} GiB of headroom, the "
        f"allocator's cache measured above its peak and {OUTSIDE_ALLOCATOR_GIB:g} GiB outside it)"
    )


def fits(estimate_gib: float, gpu_memory_gib: float) -> bool:
    """Whether an estimate leaves HEADROOM_GIB of the GPU free (the bound the generator refuses runs by)."""
    return estimate_gib <= usable_gib(gpu_memory_gib)


def preferred(estimate_gib: float, gpu_memory_gib: float) -> bool:
    """Whether `auto` may keep activations at this estimate (AUTO_FRACTION less AUTO_HEADROOM_GIB)."""
    return estimate_gib <= AUTO_FRACTION * gpu_memory_gib - AUTO_HEADROOM_GIB


def choose_activation_checkpointing(
    arch: Architecture, cfg: TrainConfig, shard: int, gpu_memory_gib: float, grad_sync: str | None = None
) -> str:
    """The least-recomputing mode `auto` prefers; 'full' when neither none nor selective is preferred
    (the caller may reject a run whose full-checkpointing estimate does not fit)."""
    for mode in AUTO_ORDER[:-1]:
        if preferred(estimate_peak_gib(arch, cfg, shard, mode, grad_sync), gpu_memory_gib):
            return mode
    return "full"


def resolve_auto(arch: Architecture, cfg: TrainConfig, shard: int, gpu_memory_gib: float) -> TrainConfig:
    """`cfg` with activation_checkpointing and grad_sync 'auto' replaced by the chosen settings.

    grad_sync 'auto' (with gradient accumulation) is 'last' (one gradient reduction per optimizer
    step) when some checkpointing mode fits with it, else 'every'; checkpointing 'auto' is then chosen
    as above. Settings that are not 'auto' are kept.
    """
    par = cfg.parallelism
    ac_fixed = par.activation_checkpointing != "auto"
    sync = par.grad_sync
    # With one micro-batch per step there is nothing to defer: 'auto' stays as written.
    if sync == "auto" and cfg.training.grad_accum_steps > 1:
        modes = (par.activation_checkpointing,) if ac_fixed else AUTO_ORDER
        sync = (
            "last"
            if any(fits(estimate_peak_gib(arch, cfg, shard, m, "last"), gpu_memory_gib) for m in modes)
            else "every"
        )
    mode = (
        par.activation_checkpointing
        if ac_fixed
        else choose_activation_checkpointing(arch, cfg, shard, gpu_memory_gib, sync)
    )
    if mode == par.activation_checkpointing and sync == par.grad_sync:
        return cfg
    changed = dataclasses.replace(par, activation_checkpointing=mode, grad_sync=sync)  # type: ignore[arg-type]
    return dataclasses.replace(cfg, parallelism=changed)
