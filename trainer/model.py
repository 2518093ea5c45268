"""The model: Hugging Face LlamaForCausalLM built on the meta device, then filled shard by shard.

Life cycle (train.py and benchmarks/train_bench.py run the same steps):
1. `build_model(cfg.model, model_dir)` creates the module on the meta device (no memory).
2. `trainer.parallelize.parallelize(...)` wraps and shards it (still meta).
3. `materialize(model, device)` allocates only this rank's shards and rebuilds the rotary tables.
4. `load_weights(model, model_dir)` or `init_random_weights(model, seed)` fills the shards.

Loading reads each rank's own rows of every tensor straight from the safetensors files (plain
reads at computed offsets, no memory map), so a rank's host memory holds its shard plus one slice
in flight, never a full copy. Random initialisation draws every full tensor from a generator seeded
by (seed, parameter name) and keeps this rank's slice, so the model is the same for every sharding
strategy and world size.

`export_hf` gathers one tensor at a time to rank 0 and writes a consolidated Hugging Face
directory (config.json + safetensors) loadable with LlamaForCausalLM.from_pretrained.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaRotaryEmbedding

from trainer.catalog import MODELS, Architecture
from trainer.config import ConfigError, ModelConfig
from trainer.loss import linear_cross_entropy

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
}
EXPORT_SHARD_BYTES = 5 * 2**30
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")


class LlamaForTraining(LlamaForCausalLM):
    """LlamaForCausalLM whose forward returns the summed loss of the trained positions.

    The loss is computed inside forward so that, under FSDP, lm_head's gathered weight is used
    between the root module's forward hooks. Without targets it returns the logits.
    """

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        loss_index: torch.Tensor | None = None,
        *,
        loss_impl: str = "chunked",
        loss_chunk_size: int = 4096,
    ) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
        if targets is None:
            return self.lm_head(hidden)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        if loss_index is not None:
            hidden = hidden.index_select(0, loss_index)
        return linear_cross_entropy(hidden, self.lm_head.weight, targets, impl=loss_impl, chunk_size=loss_chunk_size)


def read_hf_token(env_name: str) -> str | None:
    """The Hugging Face token from the file named by $env_name (None when unset); never logged."""
    path = os.environ.get(env_name, "")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        raise ConfigError(
            "model.hf_token_file_env",
            f"${env_name} names {path}, which cannot be read; mount the token file there or unset {env_name}",
        ) from None


def resolve_model_dir(cfg: ModelConfig, local_files_only: bool = False) -> str:
    """The local checkpoint directory of model.path, downloading a hub id if needed ('' = random)."""
    if not cfg.path or os.path.isdir(cfg.path):
        return cfg.path
    from huggingface_hub import snapshot_download

    return snapshot_download(
        repo_id=cfg.path,
        token=read_hf_token(cfg.hf_token_file_env),
        allow_patterns=["*.json", "*.safetensors", "tokenizer*"],
        local_files_only=local_files_only,
    )


def hf_config(cfg: ModelConfig, model_dir: str) -> LlamaConfig:
    if model_dir:
        config = LlamaConfig.from_pretrained(model_dir)
        if config.model_type != "llama":
            raise ConfigError(
                "model.path", f"{model_dir} holds a {config.model_type!r} model; only Llama checkpoints are supported"
            )
    else:
        config = LlamaConfig(**MODELS[cfg.name].hf_config())
    config._attn_implementation = cfg.attn_implementation
    config.use_cache = False
    return config


def architecture(config: LlamaConfig, name: str) -> Architecture:
    """The catalog view (parameter and FLOP counts) of the model actually built."""
    return Architecture(
        name=name,
        hf_id="",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads or config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=0.0,
        rms_norm_eps=config.rms_norm_eps,
    )


def build_model(cfg: ModelConfig, model_dir: str = "") -> LlamaForTraining:
    """The model on the meta device: nothing allocated until `materialize`."""
    config = hf_config(cfg, model_dir)
    with torch.device("meta"):
        return LlamaForTraining(config)


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Allocate this rank's shards on `device` (values undefined) and rebuild the rotary tables."""
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, LlamaRotaryEmbedding):
            fresh = LlamaRotaryEmbedding(module.config)
            module.inv_freq = fresh.inv_freq.to(device)
            module.original_inv_freq = fresh.original_inv_freq.to(device)


def named_parameters_once(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(state-dict name, parameter) pairs, each parameter once (tied weights yield the first name)."""
    seen = set()
    for name, param in model.state_dict(keep_vars=True).items():
        if isinstance(param, torch.nn.Parameter) and id(param) not in seen:
            seen.add(id(param))
            yield name, param


def _local_view(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's tensor of `param` and its offset in the full tensor."""
    if isinstance(param, DTensor):
        _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        return param.to_local(), tuple(offset)
    return param, (0,) * param.dim()


@torch.no_grad()
def init_random_weights(model: torch.nn.Module, seed: int) -> None:
    """Hugging Face's Llama init (normal(0, initializer_range) matrices, unit norms), sharding-independent."""
    config = model.config
    assert isinstance(config, LlamaConfig), type(config)
    std = config.initializer_range
    for name, param in named_parameters_once(model):
        local, offset = _local_view(param)
        if param.dim() == 1:
            local.fill_(1.0)
            continue
        gen = torch.Generator(device=local.device)
        gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        full = torch.empty(param.shape, dtype=local.dtype, device=local.device).normal_(0.0, std, generator=gen)
        local.copy_(full[tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))])


class SafetensorsReader:
    """Reads row ranges of tensors from a directory of safetensors files without mapping them."""

    def __init__(self, directory: str):
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        elif os.path.isfile(os.path.join(directory, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            raise ConfigError(
                "model.path",
                f"{directory} has no model.safetensors or "
                "model.safetensors.index.json; convert the weights to safetensors",
            )
        self.entries: dict[str, tuple[str, torch.dtype, list[int], int]] = {}
        for fname in files:
            path = os.path.join(directory, fname)
            with open(path, "rb") as fh:
                (header_len,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(header_len))
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                if meta["dtype"] not in SAFETENSORS_DTYPES:
                    raise ConfigError("model.path", f"{path}: tensor {key} has unsupported dtype {meta['dtype']}")
                self.entries[key] = (
                    path,
                    SAFETENSORS_DTYPES[meta["dtype"]],
                    meta["shape"],
                    8 + header_len + meta["data_offsets"][0],
                )

    def read_into(self, key: str, out: torch.Tensor, offset: tuple[int, ...]) -> None:
        """Copy rows offset[0]:offset[0]+len(out) of `key` (full in the other dims) into `out`."""
        path, dtype, shape, start = self.entries[key]
        if any(o != 0 for o in offset[1:]) or list(out.shape[1:]) != shape[1:]:
            raise NotImplementedError(f"{key}: only dim-0 shards can be loaded, got offset {offset}")
        if out.numel() == 0:
            return
        row_bytes = dtype.itemsize * (out.numel() // out.shape[0])
        buf = bytearray(row_bytes * out.shape[0])
        with open(path, "rb", buffering=0) as fh:
            fh.seek(start + offset[0] * row_bytes)
            view = memoryview(buf)
            while view:
                n = fh.readinto(view)
                if not n:
                    raise ConfigError("model.path", f"{path} is truncated (tensor {key})")
                view = view[n:]
        out.copy_(torch.frombuffer(buf, dtype=dtype).view(out.shape))


@torch.no_grad()
def load_weights(model: torch.nn.Module, model_dir: str) -> int:
    """Fill every parameter shard from the checkpoint in model_dir; returns the bytes read."""
    reader = SafetensorsReader(model_dir)
    total = 0
    for name, param in named_parameters_once(model):
        if name not in reader.entries:
            raise ConfigError("model.path", f"{model_dir} lacks tensor {name}; is it a Llama checkpoint?")
        _, _, shape, _ = reader.entries[name]
        if list(param.shape) != shape:
            raise ConfigError(
                "model.path",
                f"{model_dir}: {name} has shape {shape}, the model expects {list(param.shape)}; check config.json",
            )
        local, offset = _local_view(param)
        reader.read_into(name, local, offset)
        total += local.numel() * reader.entries[name][1].itemsize
    return total


def export_hf(
    model: torch.nn.Module,
    out_dir: str,
    *,
    dtype: torch.dtype,
    model_dir: str = "",
    shard_bytes: int = EXPORT_SHARD_BYTES,
) -> None:
    """Consolidated Hugging Face checkpoint in out_dir; collective (every rank calls it), rank 0 writes.

    Tensors are gathered one at a time and written in safetensors files of at most shard_bytes, so
    rank 0 holds one file's worth of host memory. The directory appears atomically (temp + rename).
    """
    from safetensors.torch import save_file

    is_writer = not dist.is_initialized() or dist.get_rank() == 0
    tmp = out_dir.rstrip("/") + ".tmp"
    if is_writer:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    files: list[tuple[str, list[str]]] = []
    pending: dict[str, torch.Tensor] = {}
    pending_bytes = total_bytes = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        if pending:
            fname = f"part-{len(files):05d}.safetensors"
            save_file(pending, os.path.join(tmp, fname), metadata={"format": "pt"})
            files.append((fname, list(pending)))
        pending, pending_bytes = {}, 0

    for name, param in named_parameters_once(model):
        full = param.full_tensor() if isinstance(param, DTensor) else param
        if not is_writer:
            continue
        tensor = full.detach().to(device="cpu", dtype=dtype).contiguous()
        size = tensor.numel() * tensor.element_size()
        if pending and pending_bytes + size > shard_bytes:
            flush()
        pending[name] = tensor
        pending_bytes += size
        total_bytes += size
    if not is_writer:
        dist.barrier()
        return
    flush()
    if len(files) == 1:
        os.rename(os.path.join(tmp, files[0][0]), os.path.join(tmp, "model.safetensors"))
    else:
        weight_map = {}
        for i, (fname, names) in enumerate(files):
            final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
            os.rename(os.path.join(tmp, fname), os.path.join(tmp, final))
            weight_map.update({n: final for n in names})
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
            json.dump({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, fh, indent=2)
    trained = model.config
    assert isinstance(trained, LlamaConfig), type(trained)
    config = LlamaConfig.from_dict(trained.to_dict())
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = dtype
    config.save_pretrained(tmp)
    for fname in TOKENIZER_FILES if model_dir else ():
        if os.path.isfile(os.path.join(model_dir, fname)):
            shutil.copy(os.path.join(model_dir, fname), tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(tmp, out_dir)
    if dist.is_initialized():
        dist.barrier()


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for _, p in named_parameters_once(model))


def describe(model: Any) -> str:
    c = model.config
    return (
        f"Llama {num_params(model) / 1e6:.1f}M params: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"heads {c.num_attention_heads}/{c.num_key_value_heads}, vocab {c.vocab_size}, "
        f"attention {c._attn_implementation}"
    )
