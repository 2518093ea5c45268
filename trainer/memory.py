"""Peak GPU memory estimate of a training run, and the `auto` activation-checkpointing choice.

One model serves the generator (which rejects runs that cannot fit and writes the resolved
checkpointing mode into each run's config) and the trainer (which resolves `auto` at start from the
real device's memory), so both choose the same way. Pure Python, no torch.

Per GPU, in bytes (P parameters, L layers, b batch per GPU, s sequence length, h hidden size,
kv KV width, i intermediate size, V vocabulary, d = 2 for bf16 and fp8 or 4 for fp32, S the shard group):
- resident state: P x (4 fp32 parameters + 8 AdamW moments, 4 in bf16) / S; with gradient
  accumulation, plus the gradients held across micro-batches: 4 P unsharded fp32 when only the last
  micro-batch reduces, else the sharded 4 P / S;
- activations or gradients, whichever is larger: backward frees a layer's saved activations as it
  produces that layer's gradients, so the two peaks do not add up. Gradients are 4 P / S. Saved
  activations are the layer input b x s x h x d for a checkpointed layer and b x s x (6h + 2kv + 4i)
  x d for a layer that keeps them (every layer with no checkpointing; all but every Nth with
  selective; x 0.8 with fp8, whose linears save float8 inputs), plus one layer being recomputed;
- gathered parameters: FULL_SHARD / HYBRID_SHARD two decoder layers (current and prefetched) plus
  the root (embeddings, final norm, lm_head) in d bytes (decoder weights 1 byte with the fp8
  all-gather); SHARD_GRAD_OP and NO_SHARD keep all P gathered; plus one layer's unsharded fp32
  gradients;
- the loss: chunked min(b x s, loss_chunk_size) rows of V fp32 logits and their gradient; full: b x s;
- a fixed 4 GiB for the CUDA context, NCCL buffers, compile workspaces and fragmentation.

Measured on one H200 (BENCHMARKS.md, Llama-2-7B, s 4096, b 2, compiled): peak allocated 110.4 GiB with
no checkpointing (estimate 119.8), 102.4 GiB with selective (estimate 107.4) and 102.2 GiB with full
(estimate 107.4), so the estimate errs on the safe side by 5-9%.

`auto` picks the mode that recomputes least and still fits in FIT_FRACTION (90%) of the GPU's memory:
none, then selective (every `selective_ac_every`th layer), then full.
"""
from __future__ import annotations

import dataclasses

from trainer.catalog import Architecture
from trainer.config import TrainConfig

GIB = 1024**3
OVERHEAD_GIB = 4.0
# Headroom for what the estimate does not see (allocator rounding, NCCL growth, compile buffers),
# and for the allocator itself: near capacity it frees and retries, which costs more than the
# recomputation saved. Measured on one H200 (BENCHMARKS.md): Llama-3.1-8B with selective checkpointing
# (estimate 93% of the GPU) ran at 8,159 tokens/s with 138.5 GiB reserved, slower than full
# checkpointing (8,596, 131.5 GiB reserved); Llama-2-7B with none (estimate 85%) was the fastest mode.
FIT_FRACTION = 0.90
AUTO_ORDER = ("none", "selective", "full")
# Saved activations of an fp8 layer against a bf16 one (measured saving about 25%; kept conservative).
FP8_ACTIVATION_FACTOR = 0.8


def estimate_peak_gib(arch: Architecture, cfg: TrainConfig, shard: int, ac_mode: str | None = None,
                      grad_sync: str | None = None) -> float:
    """Estimated peak memory per GPU in GiB; `ac_mode` and `grad_sync` override the config's."""
    P, L, h = arch.num_params, arch.num_layers, arch.hidden_size
    kv = arch.num_kv_heads * arch.head_dim
    par, tr = cfg.parallelism, cfg.training
    mode = ac_mode or par.activation_checkpointing
    if mode == "auto":
        raise ValueError("resolve activation_checkpointing 'auto' before estimating")
    # fp8 keeps bf16 parameters, activations and gathered weights (the float8 casts are transient);
    # with the float8 all-gather the gathered decoder weights are 1 byte.
    d = 4 if par.precision == "fp32" else 2
    resident = P * (4 + (4 if tr.bf16_optimizer_state else 8)) / shard
    grads = P * 4 / shard
    # An unresolved grad_sync 'auto' counts as 'every'; resolve_auto decides it before the estimate.
    if tr.grad_accum_steps > 1:
        # Gradients of the earlier micro-batches live through the later ones' activations: unsharded
        # fp32 of every parameter when only the last micro-batch reduces, else the sharded ones.
        # Measured on two H200s (Llama-2-7B, 4 micro-batches): +25.1 GiB (= 4 P) and +12.6 GiB (= 4 P / 2).
        resident += P * 4 if (grad_sync or par.grad_sync) == "last" else grads
    root = arch.num_embedding_params + h
    layer = (P - root) / L
    d_layer = 1 if par.fp8_all_gather else d
    if par.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD"):
        gathered = 2 * layer * d_layer + root * d
    else:
        gathered = (P - root) * d_layer + root * d
    gathered += layer * 4
    tokens = tr.batch_size_per_gpu * cfg.data.seq_len
    layer_in = tokens * h * d
    layer_full = tokens * (6 * h + 2 * kv + 4 * arch.intermediate_size) * d
    if par.precision == "fp8":
        # torchao saves the float8 casts of the linear layers' inputs for backward instead of bf16
        # copies. Measured on two H200s (BENCHMARKS.md): 9.3 GiB less than bf16 for Llama-2-7B and
        # 11.0 GiB for Llama-3.1-8B without checkpointing, about a quarter of the activations.
        layer_full *= FP8_ACTIVATION_FACTOR
    if mode == "none":
        acts = L * layer_full
    elif mode == "full":
        acts = L * layer_in + layer_full
    else:
        checkpointed = L // par.selective_ac_every
        acts = checkpointed * layer_in + (L - checkpointed) * layer_full + layer_full
    rows = min(tokens, tr.loss_chunk_size) if tr.loss_impl == "chunked" else tokens
    loss = rows * arch.vocab_size * 4 * 2
    return (resident + max(acts, grads) + gathered + loss) / GIB + OVERHEAD_GIB


def fits(estimate_gib: float, gpu_memory_gib: float) -> bool:
    """Whether an estimate leaves the headroom FIT_FRACTION asks for (the one bound `auto` and the
    generator's rejection share)."""
    return estimate_gib <= FIT_FRACTION * gpu_memory_gib


def choose_activation_checkpointing(arch: Architecture, cfg: TrainConfig, shard: int, gpu_memory_gib: float,
                                    grad_sync: str | None = None) -> str:
    """The least-recomputing mode whose estimate fits; 'full' when none does (the caller may reject)."""
    for mode in AUTO_ORDER:
        if fits(estimate_peak_gib(arch, cfg, shard, mode, grad_sync), gpu_memory_gib):
            return mode
    return "full"


def resolve_auto(arch: Architecture, cfg: TrainConfig, shard: int, gpu_memory_gib: float) -> TrainConfig:
    """`cfg` with activation_checkpointing and grad_sync 'auto' replaced by the chosen settings.

    grad_sync 'auto' (with gradient accumulation) is 'last' (one gradient reduction per optimizer
    step) when some checkpointing mode fits with it, else 'every'; checkpointing 'auto' is then chosen as above. Settings that are
    not 'auto' are kept.
    """
    par = cfg.parallelism
    ac_fixed = par.activation_checkpointing != "auto"
    sync = par.grad_sync
    # With one micro-batch per step there is nothing to defer: 'auto' stays as written.
    if sync == "auto" and cfg.training.grad_accum_steps > 1:
        modes = (par.activation_checkpointing,) if ac_fixed else AUTO_ORDER
        sync = "last" if any(fits(estimate_peak_gib(arch, cfg, shard, m, "last"), gpu_memory_gib)
                             for m in modes) else "every"
    mode = par.activation_checkpointing if ac_fixed else choose_activation_checkpointing(
        arch, cfg, shard, gpu_memory_gib, sync)
    if mode == par.activation_checkpointing and sync == par.grad_sync:
        return cfg
    return dataclasses.replace(cfg, parallelism=dataclasses.replace(par, activation_checkpointing=mode,
                                                                     grad_sync=sync))
