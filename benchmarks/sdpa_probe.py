"""Which kernel sdpa picks for a Llama block's attention shape, and the forward+backward time of each
fused kernel on its own on this GPU (benchmarks/reports/2026-12-04-performance-round-2.md):

    python benchmarks/sdpa_probe.py --heads 32 --kv-heads 32 --seq-len 4096 --batch-size 3
"""

from __future__ import annotations

import click

KERNELS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def probe(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, reps: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    gqa = heads != kv_heads
    choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa))
    names = ("ERROR", "MATH", *KERNELS, "OVERRIDEABLE")
    picked = next((n for n in names if hasattr(SDPBackend, n) and int(getattr(SDPBackend, n)) == choice), str(choice))
    print(f"sdpa picks {picked} for batch {batch}, heads {heads}/{kv_heads}, sequence {seq}, head {head_dim}")
    # Causal attention's executed FLOPs: forward 2 matmuls, backward 5 (scores recomputed), halved.
    flops = 7 * 2 * batch * heads * seq * seq * head_dim / 2

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        out.sum().backward()

    for kernel in KERNELS:
        try:
            with sdpa_kernel(getattr(SDPBackend, kernel)):
                for _ in range(3):
                    step()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(reps):
                    step()
                end.record()
                torch.cuda.synchronize()
        except RuntimeError as e:  # this kernel cannot run the shape
            print(f"  {kernel}: cannot run it ({str(e).splitlines()[0][:100]})")
            continue
        ms = start.elapsed_time(end) / reps
        print(f"  {kernel}: fwd+bwd {ms:.2f} ms, {flops / ms / 1e9:.0f} TFLOP/s")


@click.command()
@click.option("--batch-size", default=3, show_default=True)
@click.option("--heads", default=32, show_default=True)
@click.option("--kv-heads", default=32, show_default=True)
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--head-dim", default=128, show_default=True)
@click.option("--reps", default=20, show_default=True)
def main(batch_size: int, heads: int, kv_heads: int, seq_len: int, head_dim: int, reps: int) -> None:
    """Print the kernel sdpa picks and each fused kernel's time."""
    probe(batch_size, heads, kv_heads, seq_len, head_dim, reps)


if __name__ == "__main__":
    main()
