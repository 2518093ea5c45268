#!/usr/bin/env bash
# On a two-GPU H200 machine: the measurements of benchmarks/reports/2026-11-30-h200x2-training.md, in stages that each
# fit one device call. Results (JSON lines, logs) go to ${OUT:-/tmp/h200x2}.
#   bash benchmarks/h200x2.sh preflight   # NCCL all-reduce bus bandwidth and transport over NVLink
#   bash benchmarks/h200x2.sh suite7b     # Llama-2-7B on 2 GPUs: FSDP1 baseline, bf16, fp8, strategies
#   bash benchmarks/h200x2.sh models      # 1-GPU 7B, Llama-3.1-8B and Llama-2-13B on 2 GPUs, 2 agents
#   bash benchmarks/h200x2.sh parity      # bf16 against fp8 loss curves, one GPU each, side by side
#   bash benchmarks/h200x2.sh accum       # 4 micro-batches per step: one gradient reduction or four
#   bash benchmarks/h200x2.sh profile     # where the time goes (compute, exposed communication, idle)
#   bash benchmarks/h200x2.sh tune        # the two fastest configurations with bf16 AdamW moments
#   bash benchmarks/h200x2.sh entry       # trainer.train itself with fp8: checkpoint and resume, 7B figures
#   bash benchmarks/h200x2.sh memory      # peak memory of further shapes (13B fp8, sequence 8192)
set -uo pipefail
out="${OUT:-/tmp/h200x2}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
suite() { python3 benchmarks/suite.py --warmup 3 --steps 6 "$@"; }
for stage in "$@"; do
  case "$stage" in
    preflight)
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m trainer.preflight \
        --size-mib 256 --iters 20 --expect-transport nvlink --json "$out/preflight.json" \
        --keep-nccl-log "$out/nccl-nvlink.log"
      echo "preflight exit $?" ;;
    suite7b)
      suite --gpus 2 --out "$out/h200x2-llama2-7b.jsonl" --only \
        default,default-fp8,baseline-fsdp1,default-shard-grad-op,default-fp8-shard-grad-op,default-fp8-all-gather ;;
    models)
      suite --gpus 1 --out "$out/h200x1.jsonl" --only default,default-fp8
      suite --gpus 2 --model llama3.1-8b --out "$out/h200x2-models.jsonl" --only default,default-fp8
      suite --gpus 2 --model llama2-13b --out "$out/h200x2-models.jsonl" --only default
      suite --gpus 2 --nodes 2 --out "$out/h200x2-nodes2.jsonl" --only default,default-hybrid-shard ;;
    parity)
      python3 benchmarks/fp8_parity.py --out "$out/parity" ;;
    accum)
      suite --gpus 2 --out "$out/h200x2-accum.jsonl" --only default-accum4-sync-last,default-accum4-sync-every ;;
    profile)
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/train_bench.py --warmup 3 \
        --steps 6 --profile 3 --name default-fp8-shard-grad-op-profile --set parallelism.precision=fp8 \
        --set parallelism.sharding_strategy=SHARD_GRAD_OP --json "$out/h200x2-profile.jsonl" ;;
    tune)
      suite --gpus 2 --set training.bf16_optimizer_state=true --out "$out/h200x2-bf16-moments.jsonl" \
        --only default-shard-grad-op,default-fp8-shard-grad-op ;;
    memory)
      suite --gpus 2 --model llama2-13b --out "$out/h200x2-memory.jsonl" --only default-fp8
      suite --gpus 2 --seq-len 8192 --batch-size 1 --out "$out/h200x2-memory.jsonl" --only default ;;
    entry)
      # The trainer entry point with fp8 on GPUs: tiny model, compiled, checkpoint at 10, a second launch
      # resumes there; then Llama-2-7B fp8 on both GPUs, the figures trainer.train logs.
      t=(--config trainer/configs/tiny.yaml parallelism.precision=fp8 parallelism.compile=true
         checkpoint.dir="$out/tiny/ck" checkpoint.interval_steps=10 checkpoint.export_dir= metrics.output_dir="$out/tiny")
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m trainer.train "${t[@]}" training.max_steps=20 \
        2>&1 | grep -E "^(model|step (1|10|20) |checkpoint)"
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m trainer.train "${t[@]}" training.max_steps=30 \
        2>&1 | grep -E "^(resumed|step (11|30) )"
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m trainer.train \
        --config trainer/configs/llama2-7b.yaml model.path= data.format=synthetic training.max_steps=10 \
        training.batch_size_per_gpu=2 parallelism.precision=fp8 checkpoint.dir= checkpoint.export_dir= \
        metrics.log_interval_steps=1 metrics.output_dir="$out/llama2-7b-fp8" 2>&1 | grep -E "^(model|step)"
      cp "$out/llama2-7b-fp8/metrics.jsonl" "$out/llama2-7b-fp8-metrics.jsonl"; rm -rf "$out/tiny" "$out/llama2-7b-fp8" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
