#!/usr/bin/env bash
# Issue 20's MoE LoRA at true rank in one GPU call (branches moelora, lorafast): the op harness's moe_lora and lora
# groups against the CPU reference (Beam-1.0 shapes and odd ones, tables padded on the device against true rank, rows
# without an adapter against moe bit for bit) with split operands (--dtype float32: moe's mma.sync kernels) and the
# moe_lora group again in bfloat16 (moe's wgmma kernels), test_lora_forward (the tiny model's logits with two true-rank
# adapters on attention, the dense MLP and the experts against the cpu backend's), then one Beam-1.0 MoE layer at
# 1, 16, 64 and 256 tokens in float32 and in bfloat16: the plain moe op, moe_lora with 8 adapters at r/top_k = 8
# (true rank) and padded to r = 64, and moe_lora with no row adapted (the cost of the LoRA path alone), all as CUDA
# graphs.
# Usage: bench/gpu_lora2.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh plus test_lora_forward copied to
#        CARRY_DIR/; STEPS a comma-separated subset of ops,ops_bf16,forward,perf,perf_bf16, default all; SMALL=1 runs
#        the harness's --small cases; all steps together may pass one device call's 600 s: then run
#        ops,ops_bf16,forward and perf,perf_bf16 as two calls). Writes $OUT/lora2.log; prints the lines that matter.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_lora2.sh CARRY_DIR [STEPS]}
STEPS=,${2:-ops,ops_bf16,forward,perf,perf_bf16},
OUT=${OUT:-$(mktemp -d)}
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/lora2.log
source bench/open_carry.sh
BIN=$OPS source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header
small=()
[ "${SMALL:-0}" = 1 ] && small=(--small)
if wanted ops; then step 240 'FAIL|cases|moe_lora|error' "$OPS" test "${small[@]}" --filter moe_lora,lora --seed 11; fi
if wanted ops_bf16; then
  step 240 'FAIL|cases|moe_lora|error' "$OPS" test "${small[@]}" --filter moe_lora --dtype bfloat16 --seed 12
fi
if wanted forward; then step 120 'FAILED|PASSED|OK \]|SKIPPED|tests? ran|rror' "$CARRY/test_lora_forward"; fi
perf=(perf moe_lora --tokens 1,16,64,256 --adapters 8 --rank 64 --iterations 20)
if wanted perf; then step 240 '^\||expert adapters|perf moe_lora' "$OPS" "${perf[@]}"; fi
if wanted perf_bf16; then step 240 '^\||expert adapters|perf moe_lora' "$OPS" "${perf[@]}" --dtype bfloat16; fi
rm -f "$OUT/step.txt"
