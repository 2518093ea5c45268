"""The trainer's one typed config: the single source of truth for training settings.

The generator (generators/) validates every run's `trainer:` section of the matrix with
`from_dict`, and writes `to_dict(cfg)` into the run's ConfigMap; the trainer loads the same file
with `load_config`. This module imports neither torch nor anything heavy, so the generator stays fast.

Precedence (lowest to highest): the dataclass defaults < the YAML file < `key.path=value` overrides
on the command line.

Every error is a `ConfigError` whose message names the dotted key and the fix. Unknown keys are
errors, never warnings. Cross-field rules live in `__post_init__`; the one rule that needs the
launch topology (HYBRID_SHARD group size versus world size) is `check_topology`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


class ConfigError(ValueError):
    """A bad trainer config value. `key` is the dotted path of the offending key."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    # Architecture name from trainer.catalog.MODELS (e.g. "llama2-7b", "tiny"). Always required: it
    # names the FLOP count used for MFU and, when `path` is empty, the random-init architecture.
    name: str
    # Local Hugging Face checkpoint directory or hub id; empty means random initialisation of `name`.
    path: str = ""
    # Name of the environment variable holding the path of the Hugging Face token file. The token
    # itself is never passed on the command line or printed.
    hf_token_file_env: str = "HF_TOKEN_FILE"
    # Seed for random initialisation (identical on every rank, so shards agree).
    init_seed: int = 0
    # Attention kernel: "sdpa" (PyTorch scaled_dot_product_attention, flash/cuDNN on GPU) or "eager".
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"

    def __post_init__(self) -> None:
        _require(bool(self.name), "model.name", "must name an architecture, e.g. llama2-7b or tiny")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    # Dataset file (JSON list or JSONL). Not needed for format "synthetic".
    path: str = ""
    # samsum: {dialogue, summary}; alpaca: {instruction, input, output}; synthetic: random tokens.
    format: Literal["samsum", "alpaca", "synthetic"] = "samsum"
    # Context length in tokens.
    seq_len: int = 4096
    # Pack several examples into each seq_len window (less padding) instead of one per row.
    packing: bool = True
    # Number of synthetic examples (format "synthetic" only).
    num_synthetic_samples: int = 4096

    def __post_init__(self) -> None:
        _require(self.seq_len >= 8, "data.seq_len", "must be at least 8 tokens")
        _require(
            self.format == "synthetic" or bool(self.path),
            "data.path",
            f"format {self.format!r} needs a dataset file: set data.path to a JSON or JSONL file",
        )
        _require(self.num_synthetic_samples >= 1, "data.num_synthetic_samples", "must be at least 1")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    # Sequences per GPU per micro-step.
    batch_size_per_gpu: int = 1
    # Micro-steps accumulated per optimizer step.
    grad_accum_steps: int = 1
    # Passes over the dataset; ignored when max_steps > 0.
    num_epochs: int = 1
    # Optimizer steps to run; 0 means run num_epochs.
    max_steps: int = 0
    lr: float = 2e-5
    # Learning rate at the end of the schedule, as a fraction of lr.
    min_lr_ratio: float = 0.1
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    # Clip the global gradient norm to this value; 0 disables clipping.
    grad_clip_norm: float = 1.0
    # Keep AdamW moments in bf16 instead of fp32 (halves optimizer memory).
    bf16_optimizer_state: bool = False
    # Cross-entropy: "chunked" never materialises the full fp32 logits; "full" is the plain path.
    loss_impl: Literal["chunked", "full"] = "chunked"
    # Tokens per chunk row block for the chunked loss.
    loss_chunk_size: int = 4096
    seed: int = 42

    def __post_init__(self) -> None:
        _require(self.batch_size_per_gpu >= 1, "training.batch_size_per_gpu", "must be at least 1")
        _require(self.grad_accum_steps >= 1, "training.grad_accum_steps", "must be at least 1")
        _require(self.num_epochs >= 1, "training.num_epochs", "must be at least 1")
        _require(self.max_steps >= 0, "training.max_steps", "must be 0 (use num_epochs) or positive")
        _require(self.lr > 0 and math.isfinite(self.lr), "training.lr", "must be a positive number")
        _require(0.0 <= self.min_lr_ratio <= 1.0, "training.min_lr_ratio", "must be between 0 and 1")
        _require(self.warmup_steps >= 0, "training.warmup_steps", "must be 0 or positive")
        _require(self.weight_decay >= 0, "training.weight_decay", "must be 0 or positive")
        _require(0 <= self.adam_beta1 < 1, "training.adam_beta1", "must be in [0, 1)")
        _require(0 <= self.adam_beta2 < 1, "training.adam_beta2", "must be in [0, 1)")
        _require(self.grad_clip_norm >= 0, "training.grad_clip_norm", "must be 0 (off) or positive")
        _require(self.loss_chunk_size >= 1, "training.loss_chunk_size", "must be at least 1")


@dataclass(frozen=True, kw_only=True)
class ParallelismConfig:
    # The seed's FSDP vocabulary, mapped onto FSDP2 fully_shard:
    # FULL_SHARD (reshard after forward), SHARD_GRAD_OP (keep params gathered until backward),
    # HYBRID_SHARD (2-D mesh: replicate across shard groups, shard within), NO_SHARD (replicate).
    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD"
    # HYBRID_SHARD shard group size; 0 means the GPUs of one node (torchrun's LOCAL_WORLD_SIZE).
    shard_group_size: int = 0
    # auto: the least recomputation whose memory estimate fits the GPU (trainer.memory): none, then
    # selective, then full. The generator resolves it per run from the instance's GPU memory and
    # writes the result into the run's config; the trainer resolves it from the device at start.
    activation_checkpointing: Literal["auto", "none", "full", "selective"] = "auto"
    # Selective checkpointing: checkpoint every Nth decoder layer.
    selective_ac_every: int = 2
    # torch.compile each decoder block (GPU only; ignored with a warning on CPU). On by default: it
    # fuses the norms, rotary embedding and SwiGLU (what it adds is measured in
    # benchmarks/reports/2026-11-29-h200-trainer-one-gpu.md).
    compile: bool = True
    # How the decoder blocks are compiled: "default" (torch.compile's default mode) or "max-autotune"
    # (Inductor times Triton matmul templates against cuBLAS for every shape and keeps the faster;
    # mode max-autotune-no-cudagraphs, since FSDP's hooks cannot run inside a CUDA graph). Needs compile.
    compile_mode: Literal["default", "max-autotune"] = "default"
    # Parameters in bf16 with fp32 gradient reduction, or everything in fp32. fp8: as bf16, and the
    # decoder layers' linear projections compute in float8 (torchao, dynamic tensorwise scales);
    # the output layer (lm_head), the embeddings and the norms stay bf16.
    precision: Literal["bf16", "fp8", "fp32"] = "bf16"
    # fp8 only: how torchao scales the float8 operands (trainer/fp8.py). "tensorwise": one scale per
    # tensor, the fastest; "rowwise": one scale per row of each operand (torchao's rowwise recipe),
    # more accurate for tensors with outlier rows, at more scaling work per matmul.
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    # fp8 only: FSDP all-gathers the decoder weights in float8 (half the bytes of bf16). Off by
    # default: between two GPUs over NVLink the extra casts cost more than the traffic saved
    # (benchmarks/reports/2026-11-30-h200x2-training.md); across nodes it can pay.
    fp8_all_gather: bool = False
    # Keep the last decoder layer unsharded after forward: backward starts with it, so resharding
    # would only gather it again immediately.
    reshard_last_layer: bool = False
    # Explicit forward/backward prefetch of the next layer's all-gather.
    prefetch: bool = True
    # Gradient accumulation (training.grad_accum_steps > 1): "last" reduces gradients once, after
    # the last micro-batch (FSDP keeps unsharded fp32 gradients of every parameter meanwhile: 4 bytes
    # per parameter); "every" reduce-scatters after each micro-batch (sharded gradients only). "auto":
    # "last" when the memory estimate fits the GPU (trainer.memory), else "every".
    grad_sync: Literal["auto", "last", "every"] = "auto"

    def __post_init__(self) -> None:
        _require(
            self.shard_group_size >= 0,
            "parallelism.shard_group_size",
            "must be 0 (GPUs of one node) or a positive group size",
        )
        _require(
            self.shard_group_size == 0 or self.sharding_strategy == "HYBRID_SHARD",
            "parallelism.shard_group_size",
            "is only used with sharding_strategy HYBRID_SHARD; remove it",
        )
        _require(self.selective_ac_every >= 1, "parallelism.selective_ac_every", "must be at least 1")
        _require(
            self.compile or self.compile_mode == "default",
            "parallelism.compile_mode",
            f"{self.compile_mode} needs compile: set parallelism.compile: true or remove compile_mode",
        )
        _require(
            self.fp8_recipe == "tensorwise" or self.precision == "fp8",
            "parallelism.fp8_recipe",
            f"{self.fp8_recipe} needs precision fp8; set parallelism.precision: fp8 or remove fp8_recipe",
        )
        _require(
            not (self.fp8_all_gather and self.fp8_recipe == "rowwise"),
            "parallelism.fp8_all_gather",
            "torchao all-gathers float8 weights with tensorwise scales only; "
            "set parallelism.fp8_recipe: tensorwise or remove fp8_all_gather",
        )
        _require(
            not self.fp8_all_gather or self.precision == "fp8",
            "parallelism.fp8_all_gather",
            "needs precision fp8; set parallelism.precision: fp8 or remove fp8_all_gather",
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    # Directory for sharded checkpoints (a shared volume in the cluster); empty disables them.
    dir: str = ""
    # Save every N optimizer steps (and always at the end); 0 saves only at the end.
    interval_steps: int = 0
    # Keep the newest K complete checkpoints.
    keep_last: int = 2
    # Resume from the newest complete checkpoint in `dir` at start.
    resume: bool = True
    # Directory for a consolidated Hugging Face safetensors export at the end; empty disables it.
    export_dir: str = ""
    # How a save stops training (trainer/checkpoint.py). "async_with_pinned_mem": training waits only
    # while the state is copied into page-locked host buffers (about 1 s for Llama-2-7B with bf16
    # moments on one H200, 1.5 s with fp32 ones: benchmarks/reports/2026-12-01-checkpoints.md), allocated
    # in the background after the first step (host memory: one copy of this rank's model and
    # optimizer state, 75.3 GiB for Llama-2-7B with fp32 moments on one GPU, 50.2 GiB with bf16
    # ones); the files are written by a background thread. "async": the same
    # with ordinary host memory, allocated at every save (slower copy, no memory held between saves).
    # "disabled": the synchronous save, training waits for the files. On CPU both async modes stage
    # into ordinary memory. A save still being written is waited for before the next save starts,
    # before a SIGTERM exit and before a normal exit.
    async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "async_with_pinned_mem"
    # Threads each rank writes its shard files with (DCP FileSystemWriter thread_count), in the
    # background or, with async_mode disabled, while training waits. One H200, tmpfs, 53.9 GB: the
    # background write takes 7.1-7.8 s with 8 threads, 16 s with 4; the synchronous save about 44 s
    # with 4 to 16 threads and 67-84 s with one (which also leaves a page-locked copy of the state
    # cached in torch's host allocator).
    writer_threads: int = 8
    # Copy every complete checkpoint to s3://bucket/prefix/step-XXXXXXXX/ (trainer/s3_export.py):
    # rank 0 uploads it in the background after it is complete, verifies every object's size and
    # SHA-256 on S3 and only then writes the step's COMPLETE object there. Empty: no copy. The
    # endpoint of an S3-compatible store comes from AWS_ENDPOINT_URL, credentials from the usual
    # AWS chain (IRSA or EKS Pod Identity in the cluster).
    s3_uri: str = ""
    # Remove the local final checkpoint once its copy on S3 is verified (frees the shared volume
    # after a finished run); an export that failed leaves it in place. Needs s3_uri.
    prune_after_export: bool = False

    def __post_init__(self) -> None:
        _require(self.interval_steps >= 0, "checkpoint.interval_steps", "must be 0 (end only) or positive")
        _require(self.keep_last >= 1, "checkpoint.keep_last", "must be at least 1")
        _require(1 <= self.writer_threads <= 64, "checkpoint.writer_threads", "must be between 1 and 64")
        _require(
            not self.s3_uri or re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?", self.s3_uri) is not None,
            "checkpoint.s3_uri",
            "must be empty (no copy) or s3://bucket/prefix with a valid bucket name",
        )
        _require(
            not self.prune_after_export or bool(self.s3_uri and self.dir),
            "checkpoint.prune_after_export",
            "needs checkpoint.dir and checkpoint.s3_uri (it removes the local copy of an exported checkpoint)",
        )


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    # Where rank 0 writes metrics.jsonl and the resolved config.
    output_dir: str = "out"
    # Log every N optimizer steps.
    log_interval_steps: int = 1
    # Serve Prometheus metrics on this port from rank 0; 0 disables the endpoint.
    prometheus_port: int = 0
    # Dense bf16 peak FLOP/s of one accelerator for MFU; 0 looks it up from the GPU name
    # (trainer.catalog.GPU_PEAK_FLOPS); on CPU with 0, MFU is reported as 0.
    peak_flops: float = 0.0

    def __post_init__(self) -> None:
        _require(self.log_interval_steps >= 1, "metrics.log_interval_steps", "must be at least 1")
        _require(0 <= self.prometheus_port <= 65535, "metrics.prometheus_port", "must be 0 (off) or a TCP port")
        _require(self.peak_flops >= 0, "metrics.peak_flops", "must be 0 (auto) or positive")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the field type `tp`; no silent conversions except int -> float (and
    exponent-notation strings -> float, see below)."""
    if typing.get_origin(tp) is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(key, f"got {value!r}; use {_type_name(tp)}")
        return value
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        # PyYAML reads YAML 1.1, where `3e-4` (no dot) is a string; YAML 1.2 and users call it a number.
        if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value):
            value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    else:  # pragma: no cover - every field type is listed above
        raise TypeError(f"unsupported field type {tp!r} for {key}")
    if not ok:
        raise ConfigError(key, f"got {value!r} ({type(value).__name__}); use {_type_name(tp)}")
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # get_type_hints evaluates the string annotations on every call; the generator validates
    # thousands of configs, so resolve each class once.
    return typing.get_type_hints(cls)


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, f"must be a mapping, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"{prefix}.{key}" if prefix else str(key), f"unknown key; known keys here: {', '.join(sorted(fields))}"
            )
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(key, "is required")
            continue
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, data[name], key)
        else:
            kwargs[name] = _coerce(data[name], tp, key)
    return cls(**kwargs)


def from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """Build and validate a TrainConfig from plain data (unknown keys and bad values raise ConfigError)."""
    return _build(TrainConfig, data, "")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The fully resolved config as plain data (every field, defaults included).

    Same result as dataclasses.asdict (every leaf is an immutable scalar, so nothing needs the deep
    copy asdict makes), at a fraction of the cost when the generator resolves thousands of runs.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out[f.name] = to_dict(value) if dataclasses.is_dataclass(value) else value
    return out


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `override` into `base` (mappings merge, everything else replaces)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(item: str) -> dict[str, Any]:
    """`training.lr=3e-4` -> {"training": {"lr": 3e-4}}; the value is parsed as a YAML scalar."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(item, "overrides look like section.key=value, e.g. training.max_steps=10")
    value = yaml.safe_load(raw) if raw else ""
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


class NoDuplicateKeys:
    """PyYAML loader mixin: a key given twice in one mapping is an error, not "the last one wins".

    Used by the trainer's config loader and by the repository validation (generators/manifests.py).
    """

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        import yaml

        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable key: the base constructor reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first}); keep one", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


def load_config(path: str, overrides: typing.Sequence[str] = ()) -> TrainConfig:
    """Load a YAML config file and apply `key.path=value` overrides on top of it."""
    import yaml

    class Loader(NoDuplicateKeys, yaml.SafeLoader):
        pass

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        raise ConfigError("--config", f"file {path} not found; pass an existing YAML config") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError("--config", f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("--config", f"{path}: top level must be a mapping of sections")
    return from_dict(apply_overrides(data, overrides))


def apply_overrides(data: Mapping[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """`data` with each `key.path=value` override merged on top, in order."""
    out = dict(data)
    for item in overrides:
        out = merge(out, parse_override(item))
    return out


def check_topology(cfg: ParallelismConfig, world_size: int, local_world_size: int) -> int:
    """Check the sharding layout against the launch; returns the shard group size in use."""
    if cfg.sharding_strategy != "HYBRID_SHARD":
        return world_size if cfg.sharding_strategy != "NO_SHARD" else 1
    group = cfg.shard_group_size or local_world_size
    _require(
        group >= 1 and world_size % group == 0,
        "parallelism.shard_group_size",
        f"HYBRID_SHARD group size {group} does not divide the world size {world_size}; "
        "pick a divisor of nodes x GPUs per node",
    )
    return group
