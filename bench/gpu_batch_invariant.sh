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
#          two is the mode's cost, the question whether it can be the default;
#   completions: issue 20's check, bench/batch_invariance_serve.py on beam-nano (models/beam-nano, BF16): 1,000
#          temperature-0 completions of one prompt under random concurrent load, with the mode and without (how many
#          equal the batch-1 answer, how many distinct), and the mode's served throughput against the default's
#          (bench serve, 512 prompts of 128 + 128 tokens at concurrency 64, 3 runs each); $OUT/batch_invariance_serve.md.
# Usage: bench/gpu_batch_invariant.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh; STEPS a comma-separated
#        subset of ops,serve,perf,completions, default all; DEVICE=cpu runs the completions step alone on the cpu
#        backend, with a lighter load; COMPLETIONS its count). Writes $OUT/batch_invariant.log; prints the lines that
#        matter.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_batch_invariant.sh CARRY_DIR [STEPS]}
DEVICE=${DEVICE:-cuda}
STEPS=,${2:-ops,serve,perf,completions},
[ "$DEVICE" = cuda ] || STEPS=,completions,
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/batch_invariant.log
source bench/open_carry.sh
if [ "$DEVICE" = cuda ]; then
  source bench/cuda_env.sh
  export BEAMLINE_REQUIRE_CUDA=1
fi
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
if wanted completions; then
  sizes=(--completions "${COMPLETIONS:-1000}")
  # The cpu dry run: a lighter load and throughput runs (the 2-core VM serves beam-nano at ~100 tokens/s).
  [ "$DEVICE" = cuda ] || sizes+=(--max-tokens 16 --workers 8 --max-num-seqs 16 --max-num-batched-tokens 64
                                  --kv-cache-memory 256M --prompts 24 --input-len 64 --output-len 24 --concurrency 8
                                  --rounds 1)
  step 560 '^\||identical|Goal|costs' python3 bench/batch_invariance_serve.py "$BIN" --device "$DEVICE" "${sizes[@]}" \
    --out "$OUT"
fi
