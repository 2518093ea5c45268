"""Peak GPU memory estimate of a training run, and the `auto` activation-checkpointing choice.

One model serves the generator (which rejects runs that cannot fit and writes the resolved
checkpointing mode into each run's config) and the trainer (which resolves `auto` at start from the
real device's memory), so both choose the same way. Pure Python, no torch.

Per GPU, in bytes (P parameters, L layers, b batch per GPU, s sequence length, h hidden size,
kv KV width, i intermediate size, V vocabulary, d = 2 for bf16 or 4 for fp32, S the shard group):
- resident state: P x (4 fp32 parameters + 8 AdamW moments, 4 in bf16) / S;
- activations or gradients, whichever is larger: backward frees a layer's saved activations as it
  produces that layer's gradients, so the two peaks do not add up. Gradients are 4 P / S. Saved
  activations are the layer input b x s x h x d for a checkpointed layer and b x s x (6h + 2kv + 4i)
  x d for a layer that keeps them (every layer with no checkpointing; all but every Nth with
  selective), plus one layer being recomputed;
- gathered parameters: FULL_SHARD / HYBRID_SHARD two decoder layers (current and prefetched) plus
  the root (embeddings, final norm, lm_head) in d bytes; SHARD_GRAD_OP and NO_SHARD keep all P
  gathered; plus one layer's unsharded fp32 gradients;
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


def estimate_peak_gib(arch: Architecture, cfg: TrainConfig, shard: int, ac_mode: str | None = None) -> float:
    """Estimated peak memory per GPU in GiB; `ac_mode` overrides the config's checkpointing mode."""
    P, L, h = arch.num_params, arch.num_layers, arch.hidden_size
    kv = arch.num_kv_heads * arch.head_dim
    par, tr = cfg.parallelism, cfg.training
    mode = ac_mode or par.activation_checkpointing
    if mode == "auto":
        raise ValueError("resolve activation_checkpointing 'auto' before estimating")
    d = 2 if par.precision == "bf16" else 4
    resident = P * (4 + (4 if tr.bf16_optimizer_state else 8)) / shard
    grads = P * 4 / shard
    root = arch.num_embedding_params + h
    layer = (P - root) / L
    gathered = ((2 * layer + root) if par.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD") else P) * d
    gathered += layer * 4
    tokens = tr.batch_size_per_gpu * cfg.data.seq_len
    layer_in = tokens * h * d
    layer_full = tokens * (6 * h + 2 * kv + 4 * arch.intermediate_size) * d
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


def choose_activation_checkpointing(arch: Architecture, cfg: TrainConfig, shard: int, gpu_memory_gib: float) -> str:
    """The least-recomputing mode whose estimate fits; 'full' when none does (the caller may reject)."""
    for mode in AUTO_ORDER:
        if fits(estimate_peak_gib(arch, cfg, shard, mode), gpu_memory_gib):
            return mode
    return "full"


def resolve_auto(arch: Architecture, cfg: TrainConfig, shard: int, gpu_memory_gib: float) -> TrainConfig:
    """`cfg` with activation_checkpointing 'auto' replaced by the chosen mode (unchanged otherwise)."""
    if cfg.parallelism.activation_checkpointing != "auto":
        return cfg
    mode = choose_activation_checkpointing(arch, cfg, shard, gpu_memory_gib)
    return dataclasses.replace(cfg, parallelism=dataclasses.replace(cfg.parallelism, activation_checkpointing=mode))
