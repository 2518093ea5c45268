"""The performance benchmarks' CPU-side pieces: torchtitan's command line as titan_bench.py writes it
for the project's settings, and fp8_parity.py's variants (their check, and the comparison of three
loss curves against bf16)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO_ROOT

from benchmarks import fp8_parity, titan_bench


def options(args: list[str]) -> dict[str, str]:
    """--key value pairs; a flag without a value maps to ""."""
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = ""
            i += 1
    return out


def test_torchtitan_gets_the_projects_model_sequence_batch_and_precision():
    bf16 = options(titan_bench.titan_args("llama2-7b", 4096, 2, "bf16", "tensorwise", "none", "/tmp/t"))
    assert bf16["--model.flavor"] == "llama2-7b" and bf16["--training.seq_len"] == "4096"
    assert bf16["--training.local_batch_size"] == "2" and bf16["--activation_checkpoint.mode"] == "none"
    assert bf16["--optimizer.implementation"] == "fused" and "--compile.enable" in bf16
    assert "--model.converters" not in bf16
    fp8 = options(titan_bench.titan_args("llama3.1-8b", 4096, 2, "fp8", "rowwise", "selective", "/tmp/t"))
    assert fp8["--model.converters"] == "quantize.linear.float8"
    assert fp8["--quantize.linear.float8.recipe_name"] == "rowwise"
    # The project keeps the output layer in bf16; torchtitan converts it unless it is filtered out.
    assert fp8["--quantize.linear.float8.filter_fqns"] == "output"


def test_parity_compares_every_variant_against_bf16():
    curves = {
        "bf16": [(s, 1.0) for s in range(1, 41)],
        "fp8": [(s, 1.01) for s in range(1, 41)],
        "fp8-rowwise": [(s, 1.03) for s in range(1, 41)],
    }
    result = fp8_parity.compare(curves)
    assert result["relative_differences"] == pytest.approx({"fp8": 0.01, "fp8-rowwise": 0.03})
    assert result["relative_difference"] == pytest.approx(0.01)
    assert result["within_2_percent"] is False


@pytest.mark.parametrize("variants", ["fp8,bf16", "bf16", "bf16,fp8,fp8", "bf16,fp16"])
def test_parity_refuses_variants_that_do_not_start_with_bf16_or_are_unknown(variants, tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/fp8_parity.py", "--out", str(tmp_path / "p"), "--variants", variants],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "bf16 first" in proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("kernel", "family"),
    [
        ("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_NTN", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "inductor (fused elementwise, norms, loss)"),
        ("void at::native::split_with_sizes_copy_out_contiguous_no_cast_kernel", "copy and cast"),
        ("Memcpy DtoD (Device -> Device)", "copy and cast"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("triton_poi_fused__adamw_bf16_update_0", "optimizer"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor>", "other elementwise"),
    ],
)
def test_a_profiled_kernel_is_counted_in_its_family(kernel, family):
    from benchmarks.common import kernel_family

    assert kernel_family(kernel) == family
