"""Cross-entropy over the vocabulary projection, summed over the trained positions.

`chunked` never materialises the logits of all positions: for blocks of `chunk_size` rows it
projects with lm_head, computes the loss and the softmax gradient in fp32, and keeps only the
gradients with respect to the hidden states and the lm_head weight (the same size as the inputs).
Backward then only scales those by the incoming gradient, so no matmul is recomputed. Peak extra
memory is a few chunk_size x vocab fp32 blocks instead of batch x seq_len x vocab.

`full` is the plain path: all logits, upcast to fp32, torch cross_entropy.

Both return the fp32 sum of the per-token losses; the caller normalises (see optim.train_step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _accumulate_weight_grad(acc: torch.Tensor | None, grad_logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """acc + grad_logits^T @ hidden, accumulated in fp32 across chunks."""
    if grad_logits.is_cuda and grad_logits.dtype != torch.float32:
        # Tensor-core GEMM with fp32 output: no bf16 rounding of partial sums.
        part = torch.mm(grad_logits.t(), hidden, out_dtype=torch.float32)
    else:
        part = (grad_logits.t() @ hidden).float()
    if acc is None:
        return part
    return acc.add_(part)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int
    ) -> torch.Tensor:
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = None
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            t = targets[start : start + chunk_size]
            logits = (h @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            loss += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
            # d(loss)/d(logits) = softmax - onehot(target), computed in place on the fp32 block.
            grad = logits.sub_(lse[:, None]).exp_()
            grad.scatter_add_(1, t[:, None], torch.full_like(lse[:, None], -1.0))
            grad = grad.to(hidden.dtype)
            torch.mm(grad, weight, out=grad_hidden[start : start + chunk_size])
            grad_weight = _accumulate_weight_grad(grad_weight, grad, h)
            del logits, grad
        if grad_weight is None:  # no trained position in this micro-batch
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        # A 0-dim fp32 factor keeps the tensors' dtype and is applied at fp32 precision.
        return grad_hidden * grad_out, grad_weight * grad_out, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, impl: str = "chunked", chunk_size: int = 4096
) -> torch.Tensor:
    """Sum over rows of CE(hidden @ weight^T, targets); hidden [N, H], weight [V, H], targets [N]."""
    if impl == "chunked":
        return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk_size)
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits, targets, reduction="sum")
