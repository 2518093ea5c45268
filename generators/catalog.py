"""Catalog of the GPU instance types a run can ask for, and re-export of the model catalog.

Models live in trainer/catalog.py (MODELS: Hugging Face id, layers, hidden size, heads, KV heads,
intermediate size, vocabulary, parameters, each with its source) because the trainer needs the same
figures for random initialisation and MFU; the generator reads them from there.

Instance figures: GPUs, GPU model and memory, EFA interfaces, vCPUs and host memory. Sources, as of
the instance generation each was launched with:
- AWS "Amazon EC2 P4 Instances" product page (p4d/p4de table: 8 GPUs, 96 vCPUs, 1152 GiB, 400 Gbps
  EFA) and the EC2 User Guide "Supported instance types" for EFA (4 EFA-capable network cards).
- AWS "Amazon EC2 P5 Instances" product page (p5/p5e/p5en table: 8 GPUs, 192 vCPUs, 2 TiB host
  memory, 3200 Gbps EFA; p5/p5e with 32 network cards of 100 Gbps, p5en with 16 of 200 Gbps EFAv3).
- GPU memory per GPU from NVIDIA's A100, H100 and H200 datasheets (the "GB" figure NVIDIA prints;
  nvidia-smi reports slightly less usable memory, which the planner's fixed overhead covers).
- GPUDirect RDMA over EFA (FI_EFA_USE_DEVICE_RDMA=1) is supported on every P4 and P5 instance
  (EC2 User Guide, "Elastic Fabric Adapter for AI/ML workloads").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.catalog import MODELS, Architecture

__all__ = ["INSTANCE_TYPES", "InstanceType", "MODELS", "Architecture", "efa_for"]


@dataclass(frozen=True, kw_only=True)
class InstanceType:
    name: str
    # GPU model as the trainer's peak-FLOPs table names it (trainer.catalog.GPU_PEAK_FLOPS).
    gpu_model: str
    num_gpus: int
    gpu_memory_gib: int
    # EFA network interfaces the instance exposes (vpc.amazonaws.com/efa resources per node).
    num_efa: int
    # GPUDirect RDMA over EFA (sets FI_EFA_USE_DEVICE_RDMA=1 in the pods).
    efa_rdma: bool
    num_vcpus: int
    host_memory_gib: int

    @property
    def family(self) -> str:
        """'p5.48xlarge' -> 'p5' (used in run names)."""
        return self.name.split(".", 1)[0]


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        # P4 product page: 8x A100 40 GB HBM2, 96 vCPUs, 1152 GiB, 4x 100 Gbps EFA.
        InstanceType(name="p4d.24xlarge", gpu_model="A100", num_gpus=8, gpu_memory_gib=40, num_efa=4,
                     efa_rdma=True, num_vcpus=96, host_memory_gib=1152),
        # P4 product page: 8x A100 80 GB HBM2e, otherwise as p4d.
        InstanceType(name="p4de.24xlarge", gpu_model="A100", num_gpus=8, gpu_memory_gib=80, num_efa=4,
                     efa_rdma=True, num_vcpus=96, host_memory_gib=1152),
        # P5 product page: 8x H100 80 GB HBM3, 192 vCPUs, 2048 GiB, 32x 100 Gbps EFA.
        InstanceType(name="p5.48xlarge", gpu_model="H100", num_gpus=8, gpu_memory_gib=80, num_efa=32,
                     efa_rdma=True, num_vcpus=192, host_memory_gib=2048),
        # P5 product page: 8x H200 141 GB HBM3e, 192 vCPUs, 2048 GiB, 32x 100 Gbps EFA.
        InstanceType(name="p5e.48xlarge", gpu_model="H200", num_gpus=8, gpu_memory_gib=141, num_efa=32,
                     efa_rdma=True, num_vcpus=192, host_memory_gib=2048),
        # P5 product page: 8x H200 141 GB HBM3e, 192 vCPUs, 2048 GiB, 16x 200 Gbps EFAv3.
        InstanceType(name="p5en.48xlarge", gpu_model="H200", num_gpus=8, gpu_memory_gib=141, num_efa=16,
                     efa_rdma=True, num_vcpus=192, host_memory_gib=2048),
    )
}


def efa_for(instance: InstanceType, gpus_per_node: int) -> int:
    """EFA interfaces a pod using `gpus_per_node` GPUs requests: its share of the node's, rounded up.

    A pod with every GPU takes every interface; a pod with fewer GPUs takes the interfaces that sit
    next to its GPUs (at least one where the instance has any), leaving the rest to other pods.
    """
    if instance.num_efa == 0:
        return 0
    return max(1, math.ceil(instance.num_efa * gpus_per_node / instance.num_gpus))
