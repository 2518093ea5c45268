"""Process group, device mesh and the FSDP2 wrapping of the model.

`parallelize` applies, in this fixed order (each step wraps what the previous one produced):
0. with precision fp8, torchao's Float8Linear for the decoder layers' linear projections;
1. activation checkpointing per decoder layer (none / full / selective every Nth layer);
2. torch.compile per decoder layer (GPU only), so the compiled region contains the checkpointed block;
3. fully_shard per decoder layer, then the root (embeddings, final norm, lm_head).
Checkpointing must come first: FSDP's hooks then sit outside the checkpointed region and the
recomputation in backward reuses the already gathered parameters.

The seed's strategy names map onto FSDP2 like this:
- FULL_SHARD: 1-D mesh over all ranks, parameters resharded after forward (gathered again in backward).
- SHARD_GRAD_OP: same mesh, parameters kept gathered from forward to backward (more memory, less traffic).
- HYBRID_SHARD: 2-D mesh (replicate, shard); each shard group (default: one node) shards the model,
  the groups replicate it; gradients are reduce-scattered within and all-reduced across groups.
- NO_SHARD: 2-D mesh (world, 1): every rank holds the whole model, gradients are all-reduced (DDP).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.catalog import Architecture
from trainer.config import ParallelismConfig, TrainConfig, check_topology
from trainer.memory import GIB, resolve_auto


def _attempt_store() -> dist.Store | None:
    """torchrun's shared store, namespaced by restart attempt; None where env:// needs no help.

    Under the c10d rendezvous torchrun's agent hosts one TCPStore for the whole job
    (TORCHELASTIC_USE_AGENT_STORE=True) and restarted workers find the previous attempt's keys in it:
    gloo then connects to dead addresses and NCCL can read a stale unique id, and the restart hangs
    or fails (pytorch/pytorch#135712). A per-attempt prefix keeps the attempts apart. The restart
    count is per agent, so on several nodes launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh
    store per rendezvous round); the etcd rendezvous never shares its store and needs neither.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]), is_master=False
    )
    return dist.PrefixStore(f"trainer/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def init_distributed(local_rank: int) -> torch.device:
    """Join the process group of torchrun's environment and pick this rank's device."""
    # Expandable segments keep the reserved memory close to the allocated (the large runs sit near the
    # GPU's capacity, where fragmentation turns into out-of-memory); set before the first allocation.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    store = _attempt_store()
    topology: dict[str, Any] = (
        dict(store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])) if store else {}
    )
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # gloo beside NCCL serves CPU-side collectives (object broadcasts, barriers of checkpointing).
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device, **topology)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **topology)
    return device


def resolve_checkpointing(
    cfg: TrainConfig, arch: Architecture, world_size: int, local_world_size: int, device: torch.device
) -> TrainConfig:
    """Resolve activation_checkpointing 'auto' from this device's memory (no limit known on CPU: none)."""
    if device.type == "cuda":
        memory_gib = torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        memory_gib = float("inf")
    return resolve_auto(arch, cfg, check_topology(cfg.parallelism, world_size, local_world_size), memory_gib)


def build_mesh(cfg: ParallelismConfig, world_size: int, local_world_size: int, device_type: str) -> DeviceMesh:
    """The data-parallel mesh for the strategy; every rank is a data-parallel rank in all of them."""
    if cfg.sharding_strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    if cfg.sharding_strategy == "HYBRID_SHARD":
        group = check_topology(cfg, world_size, local_world_size)
        return init_device_mesh(device_type, (world_size // group, group), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("replicate", "shard"))


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    layers = model.get_submodule("model.layers")
    assert isinstance(layers, torch.nn.ModuleList), type(layers)
    return layers


def apply_activation_checkpointing(model: torch.nn.Module, mode: str, every: int) -> None:
    """Wrap decoder layers so their activations are recomputed in backward instead of stored."""
    if mode == "none":
        return
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        # selective: every Nth layer (the Nth, 2Nth, ...) trades recomputation for memory.
        if mode == "full" or (i + 1) % every == 0:
            layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)


def apply_compile(model: torch.nn.Module, enabled: bool, device_type: str, mode: str = "default") -> None:
    """torch.compile each decoder layer: identical blocks share one compiled graph. mode
    (parallelism.compile_mode) "max-autotune" autotunes the matmuls without CUDA graphs."""
    if not enabled:
        return
    if device_type != "cuda":
        warnings.warn("parallelism.compile is ignored on CPU", stacklevel=2)
        return
    options = {"mode": "max-autotune-no-cudagraphs"} if mode == "max-autotune" else {}
    for layer in decoder_layers(model):
        layer.compile(**options)


def apply_fsdp(model: torch.nn.Module, cfg: ParallelismConfig, mesh: DeviceMesh) -> None:
    """fully_shard every decoder layer, then the root."""
    if cfg.precision in ("bf16", "fp8"):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    # NO_SHARD has one rank per shard group, so there is nothing to reshard.
    reshard = cfg.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
    layers = decoder_layers(model)
    sharded = [
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=mp,
            reshard_after_forward=reshard and (cfg.reshard_last_layer or i < len(layers) - 1),
        )
        for i, layer in enumerate(layers)
    ]
    # The root's parameters are needed first in backward: keep them gathered.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    if cfg.prefetch and len(sharded) > 1:
        # Issue the next layer's all-gather when the current one starts, in both directions.
        for i, layer in enumerate(sharded):
            if i + 1 < len(sharded):
                layer.set_modules_to_forward_prefetch([sharded[i + 1]])
            if i > 0:
                layer.set_modules_to_backward_prefetch([sharded[i - 1]])


def apply_fp8(model: torch.nn.Module, cfg: ParallelismConfig, device_type: str) -> None:
    """Swap the decoder layers' nn.Linear for torchao's Float8Linear (precision fp8 only).

    Only linears inside model.model.layers are converted: the lm_head (its logits feed the loss, and
    torchao's recipes keep it in high precision), the embeddings and the norms stay bf16. Scales are
    dynamic, per tensor or per row (parallelism.fp8_recipe). Without an fp8-capable GPU (CPU runs,
    tests) torchao emulates the float8 matmul, so the same code path runs everywhere.
    """
    if cfg.precision != "fp8":
        return
    from torchao.float8 import convert_to_float8_training

    from trainer.fp8 import float8_linear_config

    emulate = device_type != "cuda" or torch.cuda.get_device_capability() < (8, 9)
    config = float8_linear_config(cfg, emulate)
    for layer in decoder_layers(model):
        # fp8 matmuls need both dimensions divisible by 16; every catalog architecture's are.
        convert_to_float8_training(
            layer,
            config=config,
            module_filter_fn=lambda m, _: (
                isinstance(m, torch.nn.Linear) and m.in_features % 16 == 0 and m.out_features % 16 == 0
            ),
        )


def parallelize(model: torch.nn.Module, cfg: ParallelismConfig, mesh: DeviceMesh) -> torch.nn.Module:
    """fp8 linears -> checkpointing -> compile -> FSDP, on the meta-device model; returns the same module."""
    apply_fp8(model, cfg, mesh.device_type)
    apply_activation_checkpointing(model, cfg.activation_checkpointing, cfg.selective_ac_every)
    apply_compile(model, cfg.compile, mesh.device_type, cfg.compile_mode)
    apply_fsdp(model, cfg, mesh)
    return model
