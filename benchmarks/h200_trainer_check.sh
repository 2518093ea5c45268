#!/usr/bin/env bash
# On a GPU machine: the trainer entry point itself (not the benchmark harness) on one GPU.
#   1. tiny model with the GPU defaults (bf16, compiled blocks, auto checkpointing): 20 steps with a
#      checkpoint at 10 and 20 and a Hugging Face export, then a second launch to 30 that must resume at 20;
#   2. Llama-2-7B, sequence 4096, batch 2, synthetic tokens, 12 steps: the figures trainer.train logs.
# Writes logs and metrics under ${OUT:-/tmp/h200-check}.
set -euo pipefail
out="${OUT:-/tmp/h200-check}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
run() { python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m trainer.train "$@"; }
tiny=(--config trainer/configs/tiny.yaml parallelism.compile=true parallelism.precision=bf16
      parallelism.activation_checkpointing=auto checkpoint.dir="$out/tiny/ck" checkpoint.interval_steps=10
      metrics.output_dir="$out/tiny" checkpoint.export_dir="$out/tiny/hf")
run "${tiny[@]}" training.max_steps=20 2>&1 | tee "$out/tiny-1.log" | grep -E "^(model|data|step 20|checkpoint|export)"
run "${tiny[@]}" training.max_steps=30 2>&1 | tee "$out/tiny-2.log" | grep -E "^(resumed|step 2[1-9]|step 30)" | head -3
run --config trainer/configs/llama2-7b.yaml model.path= data.format=synthetic training.max_steps=12 \
    metrics.log_interval_steps=1 metrics.prometheus_port=0 checkpoint.dir= checkpoint.export_dir= \
    metrics.output_dir="$out/llama2-7b" 2>&1 | tee "$out/llama2-7b.log" | grep -E "^(model|data|step)"
cp "$out/llama2-7b/metrics.jsonl" "$out/llama2-7b-metrics.jsonl"
