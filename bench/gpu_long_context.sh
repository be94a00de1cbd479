#!/usr/bin/env bash
# Issue 14's 1M context in one GPU call: one request of 1,048,576 tokens (prompt + output) served on one H200 with
# Beam-1.0's shapes cut to the first 12 layers (two full-attention layers, 5 and 11), dummy FP8 weights and the FP8
# KV cache, prefilled in 16K-token chunks (docs/long-context.md). Steps:
#   check  the op harness's attention cases (--small: without the 32K ones, whose CPU reference is slow) against the
#          CPU, among them the FP8-KV prefill tiles over the BF16 shadow of an E4M3 pool (attention/fp8_shadow.cu);
#   perf   prefill attention over FP8 and BF16 pools (8K causal, 32K window-512) next to its FLOP floor;
#   long   bench/long_context.py: a 128K-token request first (a figure even if 1M fails), then the 1M one: TTFT,
#          prefill tokens/s, the decode step at that context next to its floor (weights of one token's path + KV of
#          the context at 4.8 TB/s), the KV blocks held against make-model --dry-run's prediction, and the GPU's peak
#          memory (nvidia-smi every 250 ms).
# Estimated time on the H200 (docs/long-context.md): start-up ~3 min (dummy weights with --quantization fp8 are drawn
# and quantized on the host, 92 G parameters at ~33 M a core-second on 16 cores, then 97 GB uploaded), then the 1M
# prefill ~2.7e16 FLOPs of global attention (~75 s at the 367 TFLOP/s the BF16 prefill kernel reaches) plus ~1e16 of
# projections and experts (~20 s): about 2 minutes of TTFT; 128K about 5 s; the check ~50 s.
# Usage: bench/gpu_long_context.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh; STEPS a comma-separated
#        subset of check,perf,long, default check,long: at most 60 + 410 s, inside one 500 s device call). SMALL=1 runs the same steps on the CPU with the tiny preset, 8K and
#        16K tokens in 2K chunks (the script's dry run; `check` runs the harness's --small CPU-against-CPU cases).
#        LENGTHS, DECODE, CHUNK override the lengths, output tokens and chunk; LONG_LIMIT the long step's seconds
#        (410). Writes $OUT/long_context.log.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_long_context.sh CARRY_DIR [STEPS]}
STEPS=,${2:-check,long},
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/long_context.log
source bench/open_carry.sh
if [ "${SMALL:-0}" = 1 ]; then
  device=cpu preset=(--preset tiny) lengths=${LENGTHS:-8192,16384} decode=${DECODE:-16} chunk=${CHUNK:-2048}
  kv_memory=256M ops_device=(--device cpu --small) check_limit=300
else
  source bench/cuda_env.sh
  export BEAMLINE_REQUIRE_CUDA=1
  device=cuda preset=(--preset beam-1.0 --layers 12) lengths=${LENGTHS:-131072,1048576} decode=${DECODE:-128}
  chunk=${CHUNK:-16384} kv_memory=6G ops_device=(--small) check_limit=60
fi
{
  date -u '+%Y-%m-%d %H:%M UTC'
  echo "commit $(cat "$CARRY/apps/beamline/COMMIT" | tr '\n' ' ')"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "device $device, lengths $lengths, decode $decode, chunk $chunk, --kv-cache-memory $kv_memory"
} | tee "$LOG"
source bench/gpu_steps.sh
WORK=$(mktemp -d)
# The model directory (config, the 201K-token synthetic tokenizer: ~40 s of one core) is written while `check` runs.
"$BIN" make-model "${preset[@]}" --no-weights --out "$WORK/model" >"$OUT/make_model.log" 2>&1 &
maker=$!

if wanted check; then
  step "$check_limit" 'fail|FAIL|cases|paged_attention \| fp8 kv (prefill|chunk|mixed|missing)' "$OPS" test "${ops_device[@]}" \
    --filter attention --seed 14
fi
if wanted perf && [ "$device" = cuda ]; then
  step 30 '^\||pool' "$OPS" perf attention --kv-cache-dtype fp8 --filter prefill
  step 30 '^\||pool' "$OPS" perf attention --filter prefill
fi
wait "$maker" || { echo "make-model failed:"; tail -5 "$OUT/make_model.log"; exit 1; }
echo "KV prediction (make-model --dry-run --quantization fp8 --kv-tokens ${lengths##*,}):"
"$BIN" make-model --config "$WORK/model/config.json" --dry-run --quantization fp8 --kv-tokens "${lengths##*,}" |
  grep -E '^(kv |parameters|active|bytes)' | tee -a "$LOG"
if wanted long; then
  memory_log=$OUT/gpu_memory.csv
  sampler=
  if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 250 >"$memory_log" &
    sampler=$!
  fi
  step "${LONG_LIMIT:-410}" '^\||^<!--|^server|^KV pool|Error|error|Traceback|assert' python3 bench/long_context.py "$BIN" "$WORK/model" \
    --lengths "$lengths" --decode "$decode" --chunk "$chunk" --kv-cache-memory "$kv_memory" --device "$device" \
    --log "$OUT/server.log"
  if [ -n "$sampler" ]; then
    kill "$sampler"
    echo "peak GPU memory: $(sort -t, -k1 -n "$memory_log" | tail -1 | awk -F', *' '{printf "%.1f of %.1f GiB", $1/1024, $2/1024}') (nvidia-smi, every 250 ms)" |
      tee -a "$LOG"
  fi
  grep -E 'KV budget|KV cache:|error|Error' "$OUT/server.log" | tail -5
fi
rm -rf "$WORK" "$OUT/step.txt"
