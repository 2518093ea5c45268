#!/usr/bin/env bash
# On one H200: the project's trainer and torchtitan's, side by side in one device call, and the fp8
# recipes' losses against bf16 (benchmarks/reports/2026-12-03-performance.md). Stages:
#   bash benchmarks/h200_perf.sh llama2-7b   # project rows (default, batch 3/4 with bf16 moments, fp8
#                                            # tensorwise and rowwise, max-autotune) and torchtitan rows
#   bash benchmarks/h200_perf.sh llama3.1-8b # the same model comparison for Llama-3.1-8B
#   bash benchmarks/h200_perf.sh parity      # bf16, fp8 tensorwise, fp8 rowwise: 200 steps each, one GPU
#   bash benchmarks/h200_perf.sh round2-7b   # default, torchtitan, batch 3 with bf16 moments, accumulation
#   bash benchmarks/h200_perf.sh round2-8b   # Llama-3.1-8B at batch 3 with bf16 moments, bf16 and fp8
#   bash benchmarks/h200_perf.sh round2-profile round2-titan-8b round2-autotune   # see each stage
#   PERF_BEFORE=FILE bash benchmarks/h200_perf.sh round3-7b round3-8b; bash benchmarks/h200_perf.sh round3-explore
# torchtitan and torchao travel as wheels in .whl/ (pinned: torchtitan 0.2.2, torchao 0.17.0).
# Results (JSON lines, logs) go to ${OUT:-/tmp/h200-perf}. PERF_BUDGET_S (default 560) bounds a stage:
# a row that could not finish in what is left is skipped and says so.
set -uo pipefail
dest="${OUT:-/tmp/h200-perf}"
# Logs gather in a work folder and come back as one archive (a device call returns 8 files at most).
out=/tmp/h200-perf-work
mkdir -p "$dest" "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
start=$(date +%s)
budget="${PERF_BUDGET_S:-560}"
left() { echo $((budget - ($(date +%s) - start))); }
# row NAME NEED_S TOOL ARGS...: one configuration, skipped when fewer than NEED_S seconds are left.
row() {
  local name=$1 need=$2 tool=$3
  shift 3
  local t0 rest
  rest=$(left)
  if [ "$rest" -lt "$need" ]; then
    echo "SKIPPED $name: ${rest}s left, needs ${need}s" | tee -a "$out/skipped.txt"
    return
  fi
  t0=$(date +%s)
  (cd "${ROW_TREE:-.}" && BENCH_LAUNCHER="python3 -m torch.distributed.run --standalone --nproc_per_node=1" timeout $((rest - 5)) python3 -m torch.distributed.run --standalone --nproc_per_node=1 "benchmarks/$tool.py" \
    --warmup 3 --steps 8 --name "$name" --json "$out/$json" "$@" >"$out/$name.log" 2>&1)
  local rc=$?
  grep -E "^== |tokens/s per GPU|MFU|peak allocated" "$out/$name.log"
  [ $rc -eq 0 ] || { echo "FAILED $name: exit $rc"; grep -E "Error|error" "$out/$name.log" | tail -3; }
  echo "   ($name: $(($(date +%s) - t0)) s)"
}
# The checkpointing the project's row NAME resolved (`auto`), for the torchtitan row beside it.
resolved_ac() {
  python3 -c 'import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]
print([r for r in rows if r["name"] == sys.argv[2]][-1]["config"]["parallelism.activation_checkpointing"])' \
    "$out/$json" "$1" 2>/dev/null || echo selective
}
bf16m=(--set training.bf16_optimizer_state=true --set parallelism.activation_checkpointing=none)
# Round three's "-before" rows run in a copy of this tree whose trainer/optim.py is PERF_BEFORE (the
# file as it was before the change measured, e.g. `git show b357eee:trainer/optim.py`); unset, skipped.
before_tree() {
  [ -n "${PERF_BEFORE:-}" ] || return 1
  if [ ! -d /tmp/h200-perf-before ]; then
    mkdir -p /tmp/h200-perf-before && cp -a benchmarks trainer generators /tmp/h200-perf-before/ \
      && cp "$PERF_BEFORE" /tmp/h200-perf-before/trainer/optim.py
  fi
}
before_row() { before_tree && ROW_TREE=/tmp/h200-perf-before row "$@"; }
for stage in "$@"; do
  case "$stage" in
    llama2-7b)
      json=h200x1-perf-llama2-7b.jsonl
      m=(--model llama2-7b --seq-len 4096)
      row default 70 train_bench "${m[@]}" --batch-size 2
      row torchtitan 70 titan_bench "${m[@]}" --batch-size 2
      row default-fp8 70 train_bench "${m[@]}" --batch-size 2 --set parallelism.precision=fp8
      row torchtitan-fp8 70 titan_bench "${m[@]}" --batch-size 2 --precision fp8
      row default-fp8-rowwise 70 train_bench "${m[@]}" --batch-size 2 --set parallelism.precision=fp8 \
        --set parallelism.fp8_recipe=rowwise
      row batch3-bf16-moments 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}"
      row batch4-bf16-moments 80 train_bench "${m[@]}" --batch-size 4 "${bf16m[@]}"
      row fp8-batch4-bf16-moments 80 train_bench "${m[@]}" --batch-size 4 "${bf16m[@]}" \
        --set parallelism.precision=fp8
      row default-max-autotune 120 train_bench "${m[@]}" --batch-size 2 --set parallelism.compile_mode=max-autotune ;;
    llama3.1-8b)
      json=h200x1-perf-llama3.1-8b.jsonl
      m=(--model llama3.1-8b --seq-len 4096)
      row default 80 train_bench "${m[@]}" --batch-size 2
      row default-fp8 80 train_bench "${m[@]}" --batch-size 2 --set parallelism.precision=fp8
      row torchtitan 80 titan_bench "${m[@]}" --batch-size 2 --checkpointing "$(resolved_ac default)"
      row torchtitan-fp8 80 titan_bench "${m[@]}" --batch-size 2 --precision fp8 --checkpointing "$(resolved_ac default-fp8)"
      row fp8-batch4-bf16-moments 80 train_bench "${m[@]}" --batch-size 4 --set training.bf16_optimizer_state=true \
        --set parallelism.precision=fp8
      row batch3-bf16-moments 80 train_bench "${m[@]}" --batch-size 3 --set training.bf16_optimizer_state=true ;;
    round2-7b)
      # Round two (benchmarks/reports/2026-12-04-performance-round-2.md): the best bf16 row beside the
      # default, torchtitan and two micro-batches of 3 accumulated, in one call. (The cuDNN-first rows of
      # that report ran at commit 9001129, with the model.attn_backend setting it then had.)
      json=h200x1-perf2-llama2-7b.jsonl
      m=(--model llama2-7b --seq-len 4096)
      row default 70 train_bench "${m[@]}" --batch-size 2
      row torchtitan 70 titan_bench "${m[@]}" --batch-size 2
      row batch3-bf16-moments 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}"
      row batch3-bf16-moments-accum2 90 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}" \
        --set training.grad_accum_steps=2 ;;
    round2-profile)
      # Where a bf16 batch-3 step's GPU time goes (the top kernels in the log).
      json=h200x1-perf2-profile.jsonl
      m=(--model llama2-7b --seq-len 4096 --batch-size 3 --profile 2)
      row profile-batch3-bf16-moments 80 train_bench "${m[@]}" "${bf16m[@]}" ;;
    round2-titan-8b)
      # Llama-3.1-8B's default (auto -> full checkpointing) beside torchtitan with the same checkpointing.
      json=h200x1-perf2-titan-llama3.1-8b.jsonl
      m=(--model llama3.1-8b --seq-len 4096 --batch-size 2)
      row default 80 train_bench "${m[@]}"
      row torchtitan 80 titan_bench "${m[@]}" --checkpointing "$(resolved_ac default)" ;;
    round2-autotune)
      # Inductor's matmul autotuning on the best bf16 row, with the time it needs to finish.
      json=h200x1-perf2-autotune.jsonl
      row batch3-bf16-moments-max-autotune 300 train_bench --model llama2-7b --seq-len 4096 --batch-size 3 \
        "${bf16m[@]}" --set parallelism.compile_mode=max-autotune ;;
    round2-8b)
      json=h200x1-perf2-llama3.1-8b.jsonl
      m=(--model llama3.1-8b --seq-len 4096)
      bf16m8=(--set training.bf16_optimizer_state=true)
      row batch3-bf16-moments 80 train_bench "${m[@]}" --batch-size 3 "${bf16m8[@]}"
      row fp8-batch3-bf16-moments 80 train_bench "${m[@]}" --batch-size 3 "${bf16m8[@]}" --set parallelism.precision=fp8
      row default 80 train_bench "${m[@]}" --batch-size 2
      row torchtitan 80 titan_bench "${m[@]}" --batch-size 2 --checkpointing "$(resolved_ac default)" ;;
    round3-7b)
      # Round three: the clipping coefficient applied inside the optimizer's update instead of a pass of
      # its own (before/after, same call), and keeping the parameters gathered between forward and
      # backward (SHARD_GRAD_OP) on one GPU, at batch 3 and at batch 2 where memory allows it.
      json=h200x1-perf3-llama2-7b.jsonl
      m=(--model llama2-7b --seq-len 4096)
      before_row batch3-bf16-moments-before 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}"
      row batch3-bf16-moments 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}"
      before_row default-before 70 train_bench "${m[@]}" --batch-size 2
      row default 70 train_bench "${m[@]}" --batch-size 2
      row batch3-bf16-moments-shard-grad-op 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}" \
        --set parallelism.sharding_strategy=SHARD_GRAD_OP
      row batch2-bf16-moments 70 train_bench "${m[@]}" --batch-size 2 "${bf16m[@]}"
      row batch2-bf16-moments-shard-grad-op 70 train_bench "${m[@]}" --batch-size 2 "${bf16m[@]}" \
        --set parallelism.sharding_strategy=SHARD_GRAD_OP ;;
    round3-8b)
      # Llama-3.1-8B's goal rows with the clipping folded into the update.
      json=h200x1-perf3-llama3.1-8b.jsonl
      m=(--model llama3.1-8b --seq-len 4096)
      row batch3-bf16-moments 80 train_bench "${m[@]}" --batch-size 3 --set training.bf16_optimizer_state=true
      row fp8-batch3-bf16-moments 80 train_bench "${m[@]}" --batch-size 3 --set training.bf16_optimizer_state=true \
        --set parallelism.precision=fp8
      row default 80 train_bench "${m[@]}" --batch-size 2 ;;
    round3-explore)
      # Where the batch-3 step's time goes by kernel family (--profile), torchtitan beside the default
      # with the clipping folded in, and the FSDP settings a one-GPU run can change.
      json=h200x1-perf3-explore.jsonl
      m=(--model llama2-7b --seq-len 4096)
      row profile-batch3-bf16-moments 80 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}" --profile 2
      row default 70 train_bench "${m[@]}" --batch-size 2
      row torchtitan 70 titan_bench "${m[@]}" --batch-size 2
      row batch3-bf16-moments-reshard-last 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}" \
        --set parallelism.reshard_last_layer=true
      row batch3-bf16-moments-loss-chunk-12288 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}" \
        --set training.loss_chunk_size=12288
      row batch3-bf16-moments-no-prefetch 70 train_bench "${m[@]}" --batch-size 3 "${bf16m[@]}" \
        --set parallelism.prefetch=false
      row fp8-batch4-bf16-moments 80 train_bench "${m[@]}" --batch-size 4 "${bf16m[@]}" \
        --set parallelism.precision=fp8 ;;
    parity)
      timeout $(($(left) - 5)) python3 benchmarks/fp8_parity.py --out "$out/parity" --steps "${PARITY_STEPS:-200}" \
        --variants bf16,fp8,fp8-rowwise 2>&1 | tee "$out/parity.log" | grep -vE "^\s*$" | tail -8
      cp "$out/parity/"{parity.json,loss.svg} "$out/" 2>/dev/null
      for v in bf16 fp8 fp8-rowwise; do cp "$out/parity/$v.jsonl" "$out/parity-$v.jsonl" 2>/dev/null; done ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
echo "stage time $(($(date +%s) - start)) s"
cp "$out"/*.jsonl "$out"/parity.json "$out"/loss.svg "$dest/" 2>/dev/null
(cd "$out" && tar czf "$dest/logs.tgz" --exclude=samsum.jsonl --exclude=tokenizer ./*.log ./skipped.txt parity 2>/dev/null)
ls "$dest"
