"""Optimizer, learning-rate schedule and the training step.

- AdamW: the fused CUDA kernel on GPU, the foreach implementation on CPU. With
  `training.bf16_optimizer_state` the moments are kept in bf16 (AdamWBf16State), halving optimizer
  memory; the update itself is computed in fp32. Rounding to bf16 is round-to-nearest, so with
  adam_beta2 close to 1 (0.999) small second-moment updates can be lost; the default 0.95 is safe.
- Schedule: linear warm-up from lr/warmup_steps to lr, then cosine or linear decay to
  lr * min_lr_ratio at the last step (or constant).
- Step: gradient accumulation over micro-batches; the loss is the sum of token losses divided by
  the number of trained (response) tokens of the whole global batch, so every token weighs the same
  whatever the padding, the micro-batch split or the rank it lands on. Gradients are clipped on the
  sharded DTensors (clip_grad_norm_ reduces the norm across ranks).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import overload

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainer.config import TrainingConfig
from trainer.data import Batch


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _adamw_bf16_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    lr: torch.Tensor,
    beta1: torch.Tensor,
    beta2: torch.Tensor,
    eps: torch.Tensor,
    weight_decay: torch.Tensor,
    bias_correction1: torch.Tensor,
    bias_correction2_sqrt: torch.Tensor,
    grad_coef: torch.Tensor,
) -> None:
    """One AdamW step of one tensor: moments stored in bf16, arithmetic in fp32; the gradient is
    multiplied by grad_coef first (the clipping coefficient, read here instead of in a pass of its own).

    The scalars are 0-dim tensors on the device, so the compiled version is one graph for every
    step (python floats would be baked in and recompiled whenever the learning rate changes).
    """
    grad = grad.float() * grad_coef
    m = exp_avg.float().lerp_(grad, 1 - beta1)
    v = exp_avg_sq.float().mul_(beta2).add_((1 - beta2) * grad * grad)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    param.mul_(1 - lr * weight_decay).sub_(lr / bias_correction1 * m / (v.sqrt() / bias_correction2_sqrt + eps))


def _moments_to_bf16(optimizer: torch.optim.Optimizer) -> None:
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state and state[key].dtype != torch.bfloat16:
                state[key] = state[key].to(torch.bfloat16)


class AdamWBf16State(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) with exp_avg and exp_avg_sq stored in bf16.

    States are created like the parameters (DTensors under FSDP), so sharded checkpoints hold them
    like torch.optim.AdamW's. The update runs per parameter on the local shard; on GPU it is
    compiled (dynamic shapes: one kernel reads parameter, gradient and both moments once and writes
    them once, which is what the bf16 moments save bandwidth on), eager on CPU.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._compiled: Callable[..., None] | None = None
        # load_state_dict casts every state tensor to its parameter's dtype (fp32): put the moments
        # back in bf16, so a run resumed through it keeps the memory it was planned with.
        self.register_load_state_dict_post_hook(_moments_to_bf16)

    def _update_fn(self, device: torch.device):
        if device.type != "cuda":
            return _adamw_bf16_update
        if self._compiled is None:
            self._compiled = torch.compile(_adamw_bf16_update, dynamic=True, fullgraph=True)
        return self._compiled

    @overload
    def step(self, closure: None = None, grad_coef: torch.Tensor | None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float], grad_coef: torch.Tensor | None = None) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, grad_coef: torch.Tensor | None = None) -> float | None:
        """One AdamW update of every parameter with a gradient; `closure` (torch's convention) recomputes
        and returns the loss first. grad_coef (a 0-dim tensor) multiplies every gradient in the update
        itself, without changing the stored gradients (see step_clipped)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            scalars: dict[tuple[torch.device, float], tuple[torch.Tensor, ...]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                param = _local(p)
                key = (param.device, float(state["step"]))
                if key not in scalars:
                    beta1, beta2 = group["betas"]
                    # torch.full fills on the device without a blocking host-to-device copy.
                    scalars[key] = tuple(
                        torch.full((), x, dtype=torch.float32, device=param.device)
                        for x in (
                            group["lr"],
                            beta1,
                            beta2,
                            group["eps"],
                            group["weight_decay"],
                            1 - beta1 ** key[1],
                            math.sqrt(1 - beta2 ** key[1]),
                        )
                    ) + (_coef_on(grad_coef, param.device),)
                self._update_fn(param.device)(
                    param, _local(p.grad), _local(state["exp_avg"]), _local(state["exp_avg_sq"]), *scalars[key]
                )
        return loss


def _coef_on(grad_coef: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    if grad_coef is None:
        return torch.ones((), dtype=torch.float32, device=device)
    return grad_coef.to(device=device, dtype=torch.float32, non_blocking=True)


def clip_coefficient(grads: Sequence[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(global gradient norm, clipping coefficient min(1, max_norm / (norm + 1e-6))), as
    clip_grad_norm_ computes them, without multiplying the gradients: the optimizer applies the
    coefficient inside its own update (step_clipped). Both are plain 0-dim tensors on the device."""
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm, torch.clamp(max_norm / (norm + 1e-6), max=1.0)


def step_clipped(optimizer: torch.optim.Optimizer, grads: Sequence[torch.Tensor], coef: torch.Tensor) -> None:
    """optimizer.step() on the gradients multiplied by coef, in the update's own pass where the
    optimizer has one: clip_grad_norm_'s separate multiply reads and writes every fp32 gradient
    (54 GB a step for a 7B model, about 14 ms of an H200's step).

    - AdamWBf16State: coef enters its compiled update kernel.
    - torch's fused AdamW: coef enters as grad_scale (its kernel divides each gradient by it, as it
      does for a GradScaler's scale).
    - any other (the CPU foreach AdamW): the gradients are multiplied first, as clip_grad_norm_ does.
    """
    if isinstance(optimizer, AdamWBf16State):
        optimizer.step(grad_coef=coef)
        return
    if isinstance(optimizer, torch.optim.AdamW) and all(g["fused"] for g in optimizer.param_groups):
        optimizer.grad_scale = coef.reciprocal()  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
        return
    if grads:
        torch._foreach_mul_(list(grads), coef.to(grads[0].device))
    optimizer.step()


def settle_heap() -> None:
    """Collect once and move every object alive now out of the garbage collector's view (gc.freeze).

    Called after setup, before the first step: the model, compile caches and imported modules hold
    millions of long-lived Python objects, and each full collection during training would walk them
    all again (a pause of a training step, irregularly). Objects made later are collected as usual.
    """
    gc.collect()
    gc.freeze()


def build_optimizer(model: torch.nn.Module, cfg: TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (norm weights are not decayed)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    if cfg.bf16_optimizer_state:
        return AdamWBf16State(groups, lr=cfg.lr, betas=betas)
    if device.type == "cuda":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, fused=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, foreach=True)


def lr_factor(step: int, cfg: TrainingConfig, total_steps: int) -> float:
    """Multiplier of cfg.lr for optimizer step `step` (0-based: the first step is 0)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    if cfg.lr_schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainingConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))


def total_steps(cfg: TrainingConfig, micro_batches_per_epoch: int) -> int:
    """Optimizer steps of the run: max_steps, or num_epochs passes over the data."""
    if cfg.max_steps:
        return cfg.max_steps
    return max(1, cfg.num_epochs * micro_batches_per_epoch // cfg.grad_accum_steps)


@dataclass
class StepResult:
    loss: torch.Tensor  # mean loss per trained token over the global batch (0-dim, on device)
    grad_norm: torch.Tensor  # global gradient norm before clipping
    num_loss_tokens: torch.Tensor  # trained tokens in the global batch
    num_real_tokens: torch.Tensor  # non-padding input tokens in the global batch


def _fp8_all_gather_modules(model: torch.nn.Module) -> bool:
    """Whether any torchao Float8Linear all-gathers its weight in float8 (needs per-step scales)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "enable_fsdp_float8_all_gather", False):
            return True
    return False


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[Batch],
    cfg: TrainingConfig,
    dp_size: int,
    grad_sync: str = "last",
) -> StepResult:
    """Forward/backward over the micro-batches, clip, optimizer step. Collective: all ranks call it.

    grad_sync "last" (parallelism.grad_sync, resolved): FSDP reduces gradients only in the last
    micro-batch's backward; the earlier ones accumulate unsharded fp32 gradients locally, so k
    micro-batches cost one reduce-scatter instead of k. "every": a reduce-scatter per micro-batch.
    Nothing here waits for the device: the results stay tensors until the caller reads them.
    """
    device = micro_batches[0].input_ids.device
    # Built on the host and copied without blocking: a tensor made from Python numbers straight on
    # the GPU waits for every queued kernel, so the next step could not be queued ahead.
    counts = torch.tensor(
        [sum(b.num_loss_tokens for b in micro_batches), sum(b.num_real_tokens for b in micro_batches)],
        dtype=torch.int64,
    )
    counts = counts.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else counts
    dist.all_reduce(counts)
    num_loss_tokens = counts[0].clamp(min=1)
    # FSDP averages gradients over the dp_size ranks; scaling by dp_size / count turns that average
    # into the sum over all trained tokens divided by their number.
    scale = dp_size / num_loss_tokens
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    set_sync = getattr(model, "set_requires_gradient_sync", None)  # an FSDP module's
    defer = grad_sync != "every" and len(micro_batches) > 1 and set_sync is not None
    for i, batch in enumerate(micro_batches):
        if defer and set_sync is not None:
            set_sync(i == len(micro_batches) - 1)
        loss = model(
            batch.input_ids,
            batch.targets,
            batch.loss_index,
            loss_impl=cfg.loss_impl,
            loss_chunk_size=cfg.loss_chunk_size,
        )
        (loss * scale).backward()
        loss_sum += loss.detach()
    max_norm = cfg.grad_clip_norm if cfg.grad_clip_norm > 0 else math.inf
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm, coef = clip_coefficient(grads, max_norm)
    step_clipped(optimizer, grads, coef)
    optimizer.zero_grad(set_to_none=True)
    if _fp8_all_gather_modules(model):
        # One all-reduce for the float8 scales of every weight, instead of one per weight at the
        # next all-gather.
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)
    dist.all_reduce(loss_sum)
    return StepResult(
        loss=loss_sum / num_loss_tokens, grad_norm=grad_norm, num_loss_tokens=counts[0], num_real_tokens=counts[1]
    )
