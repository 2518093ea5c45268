"""Which kernel sdpa picks for a Llama block's attention shape under each model.attn_backend, and its
forward+backward time on this GPU (benchmarks/reports/2026-12-04-performance-round-2.md):

    python benchmarks/sdpa_probe.py --heads 32 --kv-heads 32 --seq-len 4096 --batch-size 3
"""

from __future__ import annotations

import os
import subprocess
import sys

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BACKENDS = ("auto", "cudnn", "flash")


def probe(backend: str, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, reps: int) -> str:
    """One backend in a fresh process (the priority order is process-wide once set)."""
    import torch
    import torch.nn.functional as F

    from trainer.model import select_attention_backend

    select_attention_backend(backend)
    q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    gqa = heads != kv_heads
    choice = torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa)
    names = ("ERROR", "MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "OVERRIDEABLE")
    backends = torch.nn.attention.SDPBackend
    name = next((n for n in names if hasattr(backends, n) and int(getattr(backends, n)) == int(choice)), str(choice))

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        out.sum().backward()

    for _ in range(3):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / reps
    # Causal attention's executed FLOPs: forward 2 matmuls, backward 5 (with the recomputed scores), halved.
    flops = 7 * 2 * batch * heads * seq * seq * head_dim / 2
    return f"{backend}: {name}, fwd+bwd {ms:.2f} ms, {flops / ms / 1e9:.0f} TFLOP/s"


@click.command()
@click.option("--batch-size", default=3, show_default=True)
@click.option("--heads", default=32, show_default=True)
@click.option("--kv-heads", default=32, show_default=True)
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--head-dim", default=128, show_default=True)
@click.option("--reps", default=20, show_default=True)
@click.option("--backend", type=click.Choice(BACKENDS), default=None, help="One backend (else each, in turn).")
def main(
    batch_size: int, heads: int, kv_heads: int, seq_len: int, head_dim: int, reps: int, backend: str | None
) -> None:
    """Print the chosen kernel and its time for each attention backend."""
    if backend:
        print(probe(backend, batch_size, heads, kv_heads, seq_len, head_dim, reps))
        return
    for b in BACKENDS:
        args = [f"--batch-size={batch_size}", f"--heads={heads}", f"--kv-heads={kv_heads}", f"--seq-len={seq_len}"]
        subprocess.run([sys.executable, __file__, *args, f"--head-dim={head_dim}", f"--reps={reps}", f"--backend={b}"])


if __name__ == "__main__":
    main()
