#!/usr/bin/env bash
# On one H200: what checkpoints cost the trainer, and the entry point against the benchmark harness.
#   speed: Llama-2-7B, sequence 4096, batch 2, bf16, the trainer's defaults: benchmarks/train_bench.py
#          (5 warm-up + 30 timed steps) and then trainer.train on the same configuration (35 steps,
#          every step logged), one after the other in the same lease; then the blocking part of an
#          asynchronous save with fp32 moments (staging only: the state, 75 GiB, cannot be held twice
#          in the machine's 128 GiB with a copy on tmpfs).
#   ckpt:  the same model with bf16 moments: asynchronous saves into /dev/shm (tmpfs, so the disk's
#          speed is out of it) after the pinned buffers were allocated in the background as the
#          trainer does, the load of the checkpoint into a fresh optimizer, synchronous saves with
#          $THREADS writer threads (default 4,8,16,1) (benchmarks/checkpoint_bench.py).
# Writes logs and JSON lines under ${OUT:-/tmp/h200-checkpoints}.
set -uo pipefail
out="${OUT:-/tmp/h200-checkpoints}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tr() { python3 -m torch.distributed.run --standalone --nproc_per_node=1 "$@"; }
info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
    nproc; free -g | head -2; df -h /dev/shm | tail -1; mount | grep -E ' /dev/shm ' || true
}
case "${1:-}" in
speed)
    info 2>&1 | tee "$out/info.txt"
    tr benchmarks/train_bench.py --model llama2-7b --seq-len 4096 --batch-size 2 --warmup 5 --steps 30 \
        --name bench --json "$out/speed.jsonl" 2>&1 | tee "$out/bench.log" | grep -vi warn
    tr -m trainer.train --config trainer/configs/llama2-7b.yaml model.path= data.format=synthetic \
        training.max_steps=35 metrics.log_interval_steps=1 metrics.prometheus_port=0 checkpoint.dir= \
        checkpoint.export_dir= metrics.output_dir="$out/entry" 2>&1 | tee "$out/entry.log" | grep -E "^(model|data|step (5|6|35) )"
    cp "$out/entry/metrics.jsonl" "$out/entry-metrics.jsonl"
    tr benchmarks/checkpoint_bench.py --model llama2-7b --dir /dev/shm/ckpt --stage-only --async-saves 3 \
        --set parallelism.compile=false --name fp32-moments --json "$out/ckpt.jsonl" 2>&1 | tee "$out/fp32.log" | grep "^=="
    ;;
ckpt)
    info 2>&1 | tee "$out/info.txt"
    tr benchmarks/checkpoint_bench.py --model llama2-7b --dir /dev/shm/ckpt --async-saves 2 --threads "${THREADS-4,8,16,1}" ${CKPT_FLAGS:-} \
        --async-threads "${ASYNC_THREADS:-4}" --set training.bf16_optimizer_state=true --set parallelism.compile=false \
        --name bf16-moments --json "$out/ckpt.jsonl" 2>&1 | tee "$out/bf16.log" | grep -E "^==|Error|error"
    free -g | head -2
    ;;
*)
    echo "usage: $0 speed|ckpt" >&2
    exit 2
    ;;
esac
