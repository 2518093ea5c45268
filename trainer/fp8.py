"""Whether this machine's GPU can train in fp8: the trainer's refusal of precision fp8 below SM 8.9.

float8 tensor cores start with CUDA compute capability 8.9 (trainer.catalog.FP8_MIN_COMPUTE_CAPABILITY).
On an older GPU (A100: SM 8.0) torchao can only emulate the float8 matmuls, which is slower than plain
bf16, so a run that asks for fp8 there would silently train slower than it would without it. The
trainer refuses it at start, before the process group or any GPU memory exists, with the one-line
config error of every other bad setting (exit status 2); the planner refuses the same run at its
matrix line (generators/plan/). Without a GPU (CPU runs and the tests) the float8 matmuls are
emulated on purpose: the same code path runs everywhere.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from trainer.catalog import FP8_MIN_COMPUTE_CAPABILITY, capability_text
from trainer.config import ConfigError, ParallelismConfig


def check_device(cfg: ParallelismConfig, device_name: str, capability: tuple[int, int] | None) -> None:
    """Raise ConfigError for precision fp8 on a GPU below SM 8.9; `capability` None means no GPU."""
    if cfg.precision != "fp8" or capability is None or capability >= FP8_MIN_COMPUTE_CAPABILITY:
        return
    raise ConfigError(
        "parallelism.precision",
        f"fp8 needs float8 tensor cores ({capability_text(FP8_MIN_COMPUTE_CAPABILITY)} or newer: H100, H200), "
        f"but this GPU ({device_name}) is {capability_text(capability)}, where fp8 is only emulated "
        "and runs slower than bf16; set parallelism.precision: bf16",
    )


def float8_linear_config(cfg: ParallelismConfig, emulate: bool) -> Any:
    """torchao's Float8LinearConfig for parallelism.fp8_recipe (a torchao.float8.Float8LinearConfig).

    tensorwise: dynamic scales, one per tensor, optionally with float8 FSDP all-gathers (fp8_all_gather).
    rowwise: torchao's "rowwise" recipe, one scale per row of each operand (axiswise), scales rounded
    to powers of two. `emulate` computes the float8 matmuls in higher precision (no float8 tensor
    cores: CPU runs and the tests).
    """
    from torchao.float8 import Float8LinearConfig

    if cfg.fp8_recipe == "rowwise":
        return dataclasses.replace(Float8LinearConfig.from_recipe_name("rowwise"), emulate=emulate)
    return Float8LinearConfig(enable_fsdp_float8_all_gather=cfg.fp8_all_gather, emulate=emulate)


def local_device(local_rank: int) -> tuple[str, tuple[int, int] | None]:
    """(name, compute capability) of the GPU this rank will use (cuda:<local_rank>, as
    trainer.parallelize.init_distributed picks it); ("cpu", None) without CUDA.

    Initialises the CUDA runtime, nothing more: no memory is allocated and no process group exists yet.
    The allocator setting init_distributed makes must precede that initialisation, so it is made here
    the same way."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    major, minor = torch.cuda.get_device_capability(local_rank)
    return torch.cuda.get_device_name(local_rank), (major, minor)
