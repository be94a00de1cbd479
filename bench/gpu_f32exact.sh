#!/usr/bin/env bash
# The float32 compute mode's three-term split on the H200 in one device call (bench/results/2026-12-03-f32exact.md):
# 1. the op harness's split-operand ops in float32, small shapes (the low-bit cases that two terms fail among them;
#    attention runs its cases in both precisions), and the GEMM families in bfloat16 (unchanged by the split);
# 2. `logits --device cuda --dtype float32` (F32 KV) against `--device cpu` on the tiny and small presets;
# 3. the rollout loop's float32 logprob gap to PyTorch, (b) (ROUNDS=1 ROLLOUTS=8 REPLAY_ROLLOUTS=64);
# 4. timings: float32 prefill attention (head_dim 128: the mma.sync kernel) and the MoE at 16 and 256 tokens, float32
#    next to bfloat16.
# Usage: bench/gpu_f32exact.sh CARRY_DIR   (CARRY_DIR from bench/make_carry.sh). Writes $OUT/f32exact.log; prints
#        the tables. Exits non-zero when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=${1:?usage: bench/gpu_f32exact.sh CARRY_DIR}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
LOG=$OUT/f32exact.log
: >"$LOG"
source bench/open_carry.sh
ROOT=$(cd "$CARRY" && pwd)
BIN=$ROOT/apps/beamline/beamline
OPS=$ROOT/tests/backend_ops/backend_ops
source bench/cuda_env.sh
WORK=$(mktemp -d)
failed=0
echo "binary built at $(cat "$ROOT/apps/beamline/COMMIT" 2>/dev/null || echo unknown); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

# 1. Harness: every row of the low-bit cases, the failing rows and the summary of each run.
for run in "float32|linear,moe,swiglu,lm_head,attention" "bfloat16|linear,moe,swiglu,lm_head"; do
  dtype=${run%%|*}
  filter=${run#*|}
  echo
  echo "## backend_ops test --dtype $dtype --small --filter $filter"
  timeout 200 "$OPS" test --device cuda --reference cpu --dtype "$dtype" --small --seed 5 --filter "$filter" \
    >"$WORK/ops-$dtype.log" 2>&1
  status=$?
  cat "$WORK/ops-$dtype.log" >>"$LOG"
  table=$(sed -n '/^| op | shape/,/cases, .* failed/p' "$WORK/ops-$dtype.log")
  echo "$table" | sed -n '1,2p'
  echo "$table" | grep -E 'low bits|FAIL' | grep -v '^$'
  summary=$(echo "$table" | tail -1)
  echo "${summary:-no table} (exit $status)"
  echo "$summary" | grep -qE '^[1-9][0-9]* cases, 0 failed$' && [ $status = 0 ] || failed=1
done

# 2. Whole-model logits, float32 on both devices.
echo
echo "## logits, cuda --dtype float32 --kv-cache-dtype float32 vs cpu"
echo "| check | measured | limit | result |"
echo "| --- | --- | --- | --- |"
for preset in tiny small; do
  model=$WORK/$preset
  "$BIN" make-model --preset "$preset" --out "$model" --seed 7 >>"$LOG" 2>&1 || { echo "make-model $preset failed"; failed=1; continue; }
  vocab=$(python3 -c "import json; print(json.load(open('$model/config.json'))['vocab_size'])")
  length=$([ $preset = tiny ] && echo 96 || echo 300)
  tokens=$(python3 -c "import random; r = random.Random(11); print(','.join(str(r.randrange(1000 if $vocab > 1000 else $vocab)) for _ in range($length)))")
  for device in cpu cuda; do
    "$BIN" logits --model "$model" --tokens "$tokens" --out "$WORK/$preset-$device.npy" --device "$device" \
      --dtype float32 --kv-cache-dtype float32 >>"$LOG" 2>&1 || failed=1
  done
  python3 bench/compare_logits.py logits "$WORK/$preset-cuda.npy" "$WORK/$preset-cpu.npy" \
    "logits $preset preset, $length tokens, cuda float32 vs cpu" || failed=1
  python3 -c "
import numpy as np
a = np.load('$WORK/$preset-cuda.npy').astype(np.float64); b = np.load('$WORK/$preset-cpu.npy').astype(np.float64)
print(f'| $preset: max |cuda - cpu| / max |cpu| | {np.abs(a - b).max() / np.abs(b).max():.3e} | (2 terms: see bench/results) | — |')"
done

# 3. The rollout loop (its (b) rows are the float32 server against PyTorch's float32 reference).
echo
echo "## ROUNDS=1 ROLLOUTS=8 REPLAY_ROLLOUTS=64 bench/gpu_rollout.sh"
ROUNDS=1 ROLLOUTS=8 REPLAY_ROLLOUTS=64 OUT=$OUT/rollout bench/gpu_rollout.sh "$CARRY" >"$WORK/rollout.log" 2>&1 || failed=1
cat "$WORK/rollout.log" >>"$LOG"
grep -E '^\| (round|step-|check|---|\(a\)|\(b\))|exit' "$WORK/rollout.log"

# 4. Timings (not checks).
echo
echo "## perf attention --dtype float32 --filter prefill (beam-1.0 heads, head_dim 128)"
timeout 60 "$OPS" perf attention --dtype float32 --filter prefill >"$WORK/attention.log" 2>&1
cat "$WORK/attention.log" >>"$LOG"
grep -E '^\|' "$WORK/attention.log"
echo
echo "## perf moe --preset beam-1.0 --tokens 16,256 --dtype float32,bfloat16"
timeout 90 "$OPS" perf moe --preset beam-1.0 --tokens 16,256 --dtype float32,bfloat16 \
  --iterations 10 >"$WORK/moe.log" 2>&1
cat "$WORK/moe.log" >>"$LOG"
grep -E '^\||^#' "$WORK/moe.log"
echo
echo "checks: $([ $failed = 0 ] && echo 'all passed' || echo 'some FAILED (see above and the log)')"
exit $failed
