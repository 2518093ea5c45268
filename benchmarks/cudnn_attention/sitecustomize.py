"""Put cuDNN attention first in PyTorch's SDPA backend priority for every process that imports it.

For the attention ablation in benchmarks/reports/2026-11-29-h200-trainer-one-gpu.md: with this folder on
PYTHONPATH, every Python process of the benchmark (torchrun's workers too) prefers cuDNN's fused attention
over the default flash-attention kernel, with no change to the trainer:

    PYTHONPATH=benchmarks/cudnn_attention torchrun --standalone --nproc_per_node=1 \
        benchmarks/train_bench.py --name default-cudnn-attention
"""

from torch.nn.attention import SDPBackend, sdpa_kernel

# Entered once and never left: the priority stays for the life of the process.
sdpa_kernel(
    [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    set_priority=True,
).__enter__()
