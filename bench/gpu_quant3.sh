#!/usr/bin/env bash
# Issue 14/21's decode kernels for quantized weights and the FP8 KV cache in one GPU call (branch quant3): the op
# harness's groups whose kernels changed against the CPU references (fp8: the one-token experts on the tensor cores;
# mxfp8, nvfp4: the down pass with every routed expert in flight; attention: the tensor-core decode kernel on E4M3
# pools), test_paged_attention, then the timings next to their floors: one MoE layer at 1, 8 and 64 tokens per
# format (route + experts, CUDA graph) and decode attention over FP8 and BF16 pools; and which block-scaled FP8
# matmuls cuBLASLt's heuristic offers (bench/cublaslt_block_scaled_probe.cu).
# Usage: bench/gpu_quant3.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh plus test_paged_attention and
#        cublaslt_probe, built from bench/cublaslt_block_scaled_probe.cu; STEPS a comma-separated subset of
#        probe,fp8,micro,attention,bf16, default all; SMALL=1 runs the harness's --small cases, MICRO_FORMATS picks the
#        formats `perf micro` times). Writes $OUT/quant3.log; prints the lines that matter.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_quant3.sh CARRY_DIR [STEPS]}
STEPS=,${2:-probe,fp8,micro,attention,bf16},
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/quant3.log
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header
small=()
[ "${SMALL:-0}" = 1 ] && small=(--small)
if wanted probe; then step 15 '^\||cuBLASLt' "$CARRY/cublaslt_probe"; fi
if wanted fp8; then
  step 30 '^\|' "$OPS" perf fp8 --no-linear --tokens 1,8,64 --iterations 20
  step 50 'FAIL|cases|one token|streamed' "$OPS" test "${small[@]}" --filter fp8 --seed 7
fi
if wanted attention; then
  step 25 '^\||pool' "$OPS" perf attention --kv-cache-dtype fp8 --filter "decode global"
  step 60 'FAIL|cases|fp8 kv' "$OPS" test "${small[@]}" --filter attention --seed 8
  step 20 'FAILED|PASSED|OK \]|tests? ran' "$CARRY/test_paged_attention"
fi
if wanted micro; then
  step 30 '^\|' "$OPS" perf micro --tokens 1,8,64 --iterations 20 --formats "${MICRO_FORMATS:-mxfp8,nvfp4}"
  step 30 'FAIL|cases|_moe' "$OPS" test "${small[@]}" --filter mxfp8,nvfp4 --seed 9
fi
if wanted bf16; then step 25 '^\||pool' "$OPS" perf attention --filter "decode global"; fi
rm -f "$OUT/step.txt"
