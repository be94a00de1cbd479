#!/usr/bin/env bash
# The FP8 block-128 checks and timings of the CUDA backend in one GPU call (branch fp8-cuda): the op harness's fp8
# group against the CPU references, the BF16 groups whose dispatch FP8 touched (small cases), `backend_ops perf fp8`
# and the PyTorch FP8 peers. Usage: bench/gpu_fp8.sh CARRY_DIR [TORCH_SCRIPT]; writes $OUT/fp8_*.log.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_fp8.sh CARRY_DIR [TORCH_SCRIPT]}
TORCH_SCRIPT=${2:-bench/torch_fp8_peers.py}
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
source bench/open_carry.sh
source bench/cuda_env.sh
{
  date -u '+%Y-%m-%d %H:%M UTC'
  echo "commit $(cat "$CARRY/apps/beamline/COMMIT")"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
} | tee "$OUT/fp8_env.log"
run() {  # seconds, log name, command...
  local limit=$1 name=$2
  shift 2
  echo "\$ $*" | tee "$OUT/fp8_$name.log"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/fp8_$name.log" | grep -E '^\| |FAIL|error|Error|cases' | tail -80
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/fp8_$name.log"
}
run ${TEST_S:-150} test "$OPS" test --filter fp8
run ${REGRESSION_S:-40} regression "$OPS" test --small --filter linear,moe,swiglu,lm_head
run ${BENCH_S:-100} bench "$OPS" perf fp8 ${BENCH_ARGS:-}
PYTHONUNBUFFERED=1 run ${TORCH_S:-90} torch python3 "$TORCH_SCRIPT" ${TORCH_ARGS:-}
