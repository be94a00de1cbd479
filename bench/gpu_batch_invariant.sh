#!/usr/bin/env bash
# --batch-invariant on the H200 in one GPU call (branch batchinv): correctness first, then what the mode costs.
#   ops:   the op harness's batch_invariance group (each op's probe rows alone and inside batches of 3-200 rows, bit
#          for bit, and against the CPU) in bfloat16, then the ordinary groups whose CUDA paths the mode replaces,
#          run in the mode against the CPU (the kernels must be right, not only stable), and the gtest
#          LinearRowsAreBitIdenticalInBatchInvariantMode's CUDA instance;
#   serve: serve_check.py's two --batch-invariant rows on the small preset (32 concurrent vs alone, BF16, defaults and
#          preemption forced: 100% argmax, identical logprobs);
#   perf:  one full-width Beam-1.0 layer (backend_ops perf layer, --dtype bfloat16, context 4096) with and without the
#          mode: decode at 1, 8, 64 and 256 sequences, and prefill chunks (4 sequences x 512 rows); the ratio of the
#          two is the mode's cost, the question whether it can be the default.
# Usage: bench/gpu_batch_invariant.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh; STEPS a comma-separated
#        subset of ops,serve,perf, default all). Writes $OUT/batch_invariant.log; prints the lines that matter.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_batch_invariant.sh CARRY_DIR [STEPS]}
STEPS=,${2:-ops,serve,perf},
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/batch_invariant.log
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header
if wanted ops; then
  step 240 'FAIL|cases' "$OPS" test --device cuda --dtype bfloat16 --batch-invariant --filter batch_invariance --seed 3
  step 300 'FAIL|cases' "$OPS" test --device cuda --dtype bfloat16 --batch-invariant \
    --filter linear,linear_rows,linear_many,swiglu,lm_head,rms_norm,attention,sample --seed 4
  # The gtest's CUDA instance, when the carry has the test programs (make_carry.sh --tests).
  if [ -s "$CARRY/tests.tar.xz" ]; then
    TESTS=$(mktemp -d)
    tar -xJf "$CARRY/tests.tar.xz" -C "$TESTS"
    step 120 'FAILED|PASSED|OK \]' "$TESTS/tests/test_backend_ops" --gtest_filter='*BatchInvariantMode*'
  fi
fi
if wanted serve; then
  MODEL=$(mktemp -d)/small
  step 60 'error' "$BIN" make-model --preset small --out "$MODEL" --seed 7
  step 400 '^\|' python3 bench/serve_check.py "$BIN" "$MODEL" cuda --batch-invariant-only
fi
if wanted perf; then
  for mode in "" --batch-invariant; do
    step 120 '^\||rows per sequence' "$OPS" perf layer --preset beam-1.0 --dtype bfloat16 --context 4096 \
      --batch 1,8,64,256 --iterations 10 $mode
    step 120 '^\||rows per sequence' "$OPS" perf layer --preset beam-1.0 --dtype bfloat16 --context 4096 \
      --batch 4 --query-rows 512 --iterations 5 $mode
  done
fi
