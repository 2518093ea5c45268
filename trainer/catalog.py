"""The one catalog shared by the trainer and the generators: model architectures, GPU peaks and the
EC2 GPU instance types (GPUs, GPU memory, EFA interfaces, host memory).

Pure data, no torch import. Parameter counts are computed from the architecture
(`Architecture.num_params`) and checked in tests against the published figure in `published_params`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Architecture:
    name: str
    hf_id: str  # Hugging Face repository id; empty for test-only architectures
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    # Llama 3.1 rope scaling (None for Llama 2); passed through to transformers' LlamaConfig.
    rope_scaling: tuple[tuple[str, object], ...] | None = None
    # The parameter count the publisher states (0 for test-only architectures).
    published_params: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_embedding_params(self) -> int:
        # Input embedding plus the untied output projection (lm_head).
        return 2 * self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h  # q, k, v, o projections (no biases in Llama)
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        return self.num_layers * per_layer + self.num_embedding_params + h  # final norm

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token by the common MFU convention (PaLM appendix B, torchtitan's
        get_dense_model_nparams_and_flops): 6 x (every parameter except the input embedding, so the
        lm_head counts) + 12 x layers x heads x head_dim x seq_len for the attention scores and
        values (no causal discount, no recomputation counted)."""
        counted = self.num_params - self.vocab_size * self.hidden_size
        return 6.0 * counted + 12.0 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def hf_config(self) -> dict:
        """Keyword arguments for transformers.LlamaConfig."""
        out: dict[str, Any] = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            tie_word_embeddings=False,
        )
        if self.rope_scaling is not None:
            out["rope_scaling"] = dict(self.rope_scaling)
        return out


_LLAMA31_ROPE = (
    ("rope_type", "llama3"),
    ("factor", 8.0),
    ("low_freq_factor", 1.0),
    ("high_freq_factor", 4.0),
    ("original_max_position_embeddings", 8192),
)

MODELS: dict[str, Architecture] = {
    a.name: a
    for a in (
        # Source: config.json of meta-llama/Llama-2-7b-hf; 6.74B parameters per the model card.
        Architecture(
            name="llama2-7b",
            hf_id="meta-llama/Llama-2-7b-hf",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=32,
            intermediate_size=11008,
            vocab_size=32000,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            published_params=6_738_415_616,
        ),
        # Source: config.json of meta-llama/Llama-2-13b-hf; 13.0B parameters per the model card.
        Architecture(
            name="llama2-13b",
            hf_id="meta-llama/Llama-2-13b-hf",
            num_layers=40,
            hidden_size=5120,
            num_heads=40,
            num_kv_heads=40,
            intermediate_size=13824,
            vocab_size=32000,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            published_params=13_015_864_320,
        ),
        # Source: config.json of meta-llama/Llama-2-70b-hf (grouped-query attention, 8 KV heads).
        Architecture(
            name="llama2-70b",
            hf_id="meta-llama/Llama-2-70b-hf",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            intermediate_size=28672,
            vocab_size=32000,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            published_params=68_976_648_192,
        ),
        # Source: config.json of meta-llama/Llama-3.1-8B; 8.03B parameters per the model card.
        Architecture(
            name="llama3.1-8b",
            hf_id="meta-llama/Llama-3.1-8B",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            rope_scaling=_LLAMA31_ROPE,
            published_params=8_030_261_248,
        ),
        # Source: config.json of meta-llama/Llama-3.1-70B; 70.6B parameters per the model card.
        Architecture(
            name="llama3.1-70b",
            hf_id="meta-llama/Llama-3.1-70B",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            intermediate_size=28672,
            vocab_size=128256,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            rope_scaling=_LLAMA31_ROPE,
            published_params=70_553_706_496,
        ),
        # Test-only: runs on CPU in seconds. Vocabulary covers the trainer's byte-level tokenizer.
        Architecture(
            name="tiny",
            hf_id="",
            num_layers=2,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=128,
            vocab_size=512,
            max_position_embeddings=2048,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
        ),
    )
}

# Dense (no sparsity) bf16 tensor-core peak per GPU, FLOP/s, from NVIDIA's datasheets:
# A100 SXM 312 TFLOP/s (A100 datasheet); H100 SXM 989 TFLOP/s (H100 datasheet, 1,979 with sparsity);
# H200 SXM 989 TFLOP/s (H200 datasheet: same tensor cores as H100).
GPU_PEAK_FLOPS: dict[str, float] = {
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}


# CUDA compute capability (SM version) per GPU model, from NVIDIA's CUDA GPUs table
# (developer.nvidia.com/cuda-gpus): A100 8.0 (Ampere), H100 and H200 9.0 (Hopper).
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "A100": (8, 0),
    "H100": (9, 0),
    "H200": (9, 0),
}
# float8 tensor cores start with compute capability 8.9 (Ada, Hopper). Below it torchao can only
# emulate the float8 matmuls (casts around bf16 ones), slower than plain bf16, so precision fp8 is
# refused there: by the planner at the matrix line and by the trainer at start (trainer/config.py).
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)


def capability_text(capability: tuple[int, int]) -> str:
    """(8, 0) -> 'SM 8.0'."""
    return f"SM {capability[0]}.{capability[1]}"


def peak_flops_for(device_name: str) -> float:
    """Peak for a torch.cuda.get_device_name() string such as 'NVIDIA H200'; 0 when unknown."""
    upper = device_name.upper()
    for gpu, peak in GPU_PEAK_FLOPS.items():
        if gpu in upper:
            return peak
    return 0.0


# EC2 GPU instance types a run can ask for: GPUs, GPU model and memory, EFA interfaces, vCPUs and host
# memory. Sources, as of the instance generation each was launched with:
# - AWS "Amazon EC2 P4 Instances" product page (p4d/p4de table: 8 GPUs, 96 vCPUs, 1152 GiB, 400 Gbps
#   EFA) and the EC2 User Guide "Supported instance types" for EFA (4 EFA-capable network cards).
# - AWS "Amazon EC2 P5 Instances" product page (p5/p5e/p5en table: 8 GPUs, 192 vCPUs, 2 TiB host
#   memory, 3200 Gbps EFA; p5/p5e with 32 network cards of 100 Gbps, p5en with 16 of 200 Gbps EFAv3).
# - GPU memory per GPU from NVIDIA's A100, H100 and H200 datasheets (the "GB" figure NVIDIA prints;
#   nvidia-smi reports slightly less usable memory, which the planner's fixed overhead covers).
# - GPUDirect RDMA over EFA (FI_EFA_USE_DEVICE_RDMA=1) is supported on every P4 and P5 instance
#   (EC2 User Guide, "Elastic Fabric Adapter for AI/ML workloads").


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
    # Network bandwidth of the instance in Gbit/s (the product pages above); the NCCL pre-flight
    # check's minimum bus bandwidth is derived from it (generators/render/preflight.py).
    network_gbps: int
    num_vcpus: int
    host_memory_gib: int

    @property
    def compute_capability(self) -> tuple[int, int]:
        """The GPU's CUDA compute capability (GPU_COMPUTE_CAPABILITY)."""
        return GPU_COMPUTE_CAPABILITY[self.gpu_model]

    @property
    def family(self) -> str:
        """'p5.48xlarge' -> 'p5' (used in run names)."""
        return self.name.split(".", 1)[0]


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        # P4 product page: 8x A100 40 GB HBM2, 96 vCPUs, 1152 GiB, 4x 100 Gbps EFA.
        InstanceType(
            name="p4d.24xlarge",
            gpu_model="A100",
            num_gpus=8,
            gpu_memory_gib=40,
            num_efa=4,
            efa_rdma=True,
            network_gbps=400,
            num_vcpus=96,
            host_memory_gib=1152,
        ),
        # P4 product page: 8x A100 80 GB HBM2e, otherwise as p4d.
        InstanceType(
            name="p4de.24xlarge",
            gpu_model="A100",
            num_gpus=8,
            gpu_memory_gib=80,
            num_efa=4,
            efa_rdma=True,
            network_gbps=400,
            num_vcpus=96,
            host_memory_gib=1152,
        ),
        # P5 product page: 8x H100 80 GB HBM3, 192 vCPUs, 2048 GiB, 32x 100 Gbps EFA.
        InstanceType(
            name="p5.48xlarge",
            gpu_model="H100",
            num_gpus=8,
            gpu_memory_gib=80,
            num_efa=32,
            efa_rdma=True,
            network_gbps=3200,
            num_vcpus=192,
            host_memory_gib=2048,
        ),
        # P5 product page: 8x H200 141 GB HBM3e, 192 vCPUs, 2048 GiB, 32x 100 Gbps EFA.
        InstanceType(
            name="p5e.48xlarge",
            gpu_model="H200",
            num_gpus=8,
            gpu_memory_gib=141,
            num_efa=32,
            efa_rdma=True,
            network_gbps=3200,
            num_vcpus=192,
            host_memory_gib=2048,
        ),
        # P5 product page: 8x H200 141 GB HBM3e, 192 vCPUs, 2048 GiB, 16x 200 Gbps EFAv3.
        InstanceType(
            name="p5en.48xlarge",
            gpu_model="H200",
            num_gpus=8,
            gpu_memory_gib=141,
            num_efa=16,
            efa_rdma=True,
            network_gbps=3200,
            num_vcpus=192,
            host_memory_gib=2048,
        ),
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
