#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one go, for the GPU machine (device time is scarce: one call).
# Usage: bench/gpu_check.sh [BUILD_DIR]   (default build-cuda-dev; a build made elsewhere with
#        -DBEAMLINE_CUDA=ON, i.e. -gencode=arch=compute_90a,code=sm_90a; its COMMIT file names the commit)
# Writes $OUT/gpu_check.md (the results table: date, GPU, commit, commands) and $OUT/gpu_check.log. Checks: binary
# portability (ldd), the op harness (backend_ops test, both dtypes), `logits --device cuda` against `--device cpu` on
# the tiny and small presets, decode after prefill against one-shot prefill (`generate`), one weight allocation, and
# the serving comparison; then the full-width layer timing (backend_ops perf layer). Honest counts: a check that did
# not run is "not run" and fails the script like a failed one; informational rows are listed apart and not counted.
# The last line is "N passed, M failed, K not run"; the exit status is 0 only when every check ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda-dev}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
BIN=$PWD/$BUILD/apps/beamline/beamline
OPS=$PWD/$BUILD/tests/backend_ops/backend_ops
WORK=$(mktemp -d)
REPORT=$OUT/gpu_check.md
LOG=$OUT/gpu_check.log
: >"$LOG"
INFO=$(mktemp)

CARRY=$BUILD source bench/open_carry.sh
source bench/cuda_env.sh

source bench/check_table.sh

commit=$(cat "$BUILD/apps/beamline/COMMIT" 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
{
  echo "# CUDA backend GPU check"
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| date | $(date -u '+%Y-%m-%d %H:%M UTC') |"
  echo "| GPU | ${gpu:-unknown} |"
  echo "| commit | $commit |"
  echo "| command | \`bench/gpu_check.sh $BUILD\` |"
  echo "| host | $(nproc) cores, $(uname -r) |"
} >"$REPORT"

section "Checks"
echo "| check | measured | limit | result |" >>"$REPORT"
echo "| --- | --- | --- | --- |" >>"$REPORT"

# 1. The binary needs nothing beyond glibc, the driver, cuBLAS and what it carries in apps/beamline/lib (cpp-httplib,
#    and Open MPI's libraries since the parallel runtime links them; OpenSSL, zlib, brotli and libcap, which every
#    Debian/Ubuntu base image has, come from the image). A library from anywhere else is one the GPU machine may lack.
if [ -x "$BIN" ]; then
  carried_dir=$(cd "$(dirname "$BIN")/lib" 2>/dev/null && pwd)
  base='^(linux-vdso|/lib64/ld-linux|libc\.so|libm\.so|libgcc_s|libdl|librt|libpthread|libcuda\.so|libcublas(Lt)?\.so|libstdc\+\+|libssl|libcrypto|libz\.so|libbrotli|libcap\.so)'
  carried=$(ldd "$BIN" | awk -v dir="$carried_dir/" 'index($3, dir) == 1 {print $1}' | tr '\n' ' ')
  extra=$(ldd "$BIN" | awk -v dir="$carried_dir/" 'index($3, dir) != 1 {print $1}' | grep -v -E "$base" | tr '\n' ' ')
  missing=$(ldd "$BIN" | grep -c 'not found')
  logged ldd "$BIN"
  check_row "portable binary (ldd)" "carried: ${carried:-none}; from elsewhere: ${extra:-none}; not found: $missing" \
    "glibc, cuBLAS, the image's TLS/zlib, carried libraries only" "$([ -z "$extra" ] && [ "$missing" = 0 ] && echo 1 || echo 0)"
else
  check_row "portable binary (ldd)" "$BIN is not in this build" "glibc, cuBLAS, HTTP stack only" "not run"
fi

# 2. Op-by-op harness (tests/backend_ops), in both compute dtypes (float32: FP32-accurate tolerances; bfloat16: BF16
#    ones), then bfloat16 in batch-invariant mode: each op's rows alone and in batches of 3-200 rows, bit for bit.
ops_tables=""
# The attention cases run in both precisions within each run, and projections of 1-2 rows are exact in both;
# bfloat16 changes only the other GEMM-based ops.
for run in "float32|" "bfloat16|--filter linear_many,moe,swiglu,lm_head" \
           "bfloat16|--batch-invariant --filter batch_invariance"; do
  start=$SECONDS
  dtype=${run%%|*}
  filter=${run#*|}
  name="backend_ops test --dtype $dtype ${filter:-(every op)}, cuda vs cpu"
  if [ ! -x "$OPS" ]; then
    check_row "$name" "$OPS is not in this build" "0 failed" "not run"
    continue
  fi
  timeout 360 "$OPS" test --device cuda --reference cpu --dtype "$dtype" --seed "$RANDOM" $filter \
    >"$WORK/ops.log" 2>&1
  status=$?
  cat "$WORK/ops.log" >>"$LOG"
  ops_table=$(sed -n '/^| op | shape/,/cases, .* failed/p' "$WORK/ops.log")
  summary=$(echo "$ops_table" | tail -1)
  # Passed only when it exited 0 and printed its table, with cases in it and none failed.
  passed=$([ $status = 0 ] && echo "$summary" | grep -qE '^[1-9][0-9]* cases, 0 failed$' && echo 1 || echo 0)
  check_row "$name" "${summary:-no table} (exit $status) in $((SECONDS - start)) s" "0 failed" "$passed"
  ops_tables="$ops_tables
### --dtype $dtype $filter

$ops_table
"
done

# 3. Whole-model logits and decode on both devices.
EXACT="--dtype float32 --kv-cache-dtype float32"
for preset in tiny small; do
  model=$WORK/$preset
  if ! logged "$BIN" make-model --preset "$preset" --out "$model" --seed 7; then
    check_row "make-model $preset (the logits and decode checks of this preset did not run)" failed "exit 0" 0
    for check in "logits float32" "logits bfloat16" "decode after prefill"; do
      check_row "$check, $preset preset" "make-model failed" "" "not run"
    done
    continue
  fi
  vocab=$(python3 -c "import json; print(json.load(open('$model/config.json'))['vocab_size'])")
  length=$([ $preset = tiny ] && echo 96 || echo 300)
  tokens=$(python3 -c "import random; r = random.Random(11); print(','.join(str(r.randrange(1000 if $vocab > 1000 else $vocab)) for _ in range($length)))")
  # The exact checks run the GPU in --dtype float32 with an F32 KV cache, like the CPU; --dtype auto (bfloat16
  # operands, BF16 KV) gets its own looser row.
  for device in cpu cuda; do
    logged "$BIN" logits --model "$model" --tokens "$tokens" --out "$WORK/$preset-$device.npy" --device "$device" $EXACT
  done
  logged "$BIN" logits --model "$model" --tokens "$tokens" --out "$WORK/$preset-cuda-bf16.npy" --device cuda
  name="logits $preset preset, $length tokens, cuda (--dtype float32) vs cpu"
  checks_from "$name" 1 python3 bench/compare_logits.py logits "$WORK/$preset-cuda.npy" "$WORK/$preset-cpu.npy" "$name"
  name="logits $preset preset, $length tokens, cuda (--dtype auto: bfloat16, BF16 KV) vs cpu"
  checks_from "$name" 1 python3 bench/compare_logits.py logits-bf16 "$WORK/$preset-cuda-bf16.npy" "$WORK/$preset-cpu.npy" "$name"

  prompt=$(echo "$tokens" | cut -d, -f1-24)
  for device in cpu cuda; do
    "$BIN" generate --model "$model" --tokens "$prompt" --max-tokens 24 --ignore-eos --device "$device" $EXACT \
      >"$WORK/$preset-generate-$device.txt" 2>>"$LOG"
    printf '\n$ generate %s %s -> %s\n' "$preset" "$device" "$(cat "$WORK/$preset-generate-$device.txt")" >>"$LOG"
  done
  # stdout also carries the log lines: the ids are the line of comma-separated numbers.
  ids=$(grep -E '^[0-9]+(,[0-9]+)*$' "$WORK/$preset-generate-cuda.txt" | tail -1)
  cpu_ids=$(grep -E '^[0-9]+(,[0-9]+)*$' "$WORK/$preset-generate-cpu.txt" | tail -1)
  logged "$BIN" logits --model "$model" --tokens "$prompt,$ids" --out "$WORK/$preset-forced.npy" --device cuda $EXACT
  name="decode after prefill = one-shot prefill ($preset, cuda, 24 tokens)"
  checks_from "$name" 1 python3 bench/compare_logits.py decode "$WORK/$preset-forced.npy" 24 "$ids" "$name"
  same=$(python3 -c "a='$ids'.split(','); b='$cpu_ids'.split(','); print(sum(x == y for x, y in zip(a, b)), len(b))")
  info_row "greedy generate $preset: cuda tokens equal cpu tokens" "${same% *} of ${same#* }"
done

# Weights arrive in one device allocation (Backend::reserve_weights), logged when each cuda backend closes.
arenas=$(sed -n '/make-model/,$p' "$LOG" | grep -oE 'weights [0-9.]+ MiB in [0-9]+ allocation' | awk '{print $5}' | sort -u | tr '\n' ' ')
check_row "weights in one device allocation (every cuda logits/generate run)" "allocations per model: ${arenas:-none logged}" "1" \
  "$([ "$(echo $arenas)" = 1 ] && echo 1 || echo 0)"

# 4. Serving comparison (needs `beamline serve`, which is built separately).
if [ ! -d "$WORK/small" ]; then
  check_row "serve --device cuda, 32 concurrent requests" "no small model (make-model failed)" "" "not run"
elif "$BIN" serve --help >/dev/null 2>&1; then
  checks_from "serve_check.py (13 comparisons)" 13 python3 bench/serve_check.py "$BIN" "$WORK/small" cuda \
    --bfloat16-model models/beam-nano
else
  check_row "serve --device cuda, 32 concurrent requests" "this build has no \`beamline serve\`" "" "not run"
fi

info_section

# 5. A timing (not a check) of one full-width Beam-1.0 layer, random weights made on the device.
section "One full-width Beam-1.0 decoder layer (random on-device weights, BF16, KV BF16, context 4096)"
logged "$OPS" perf layer --preset beam-1.0 --batch 1,64 --context 4096 --iterations 20 ||
  echo "(backend_ops perf layer failed: see the log)" >>"$REPORT"
sed -n '/^| layer | batch/,/^$/p' "$LOG" >>"$REPORT"
grep 'device allocations after warm-up' "$LOG" >>"$REPORT"
echo >>"$REPORT"
echo "Floor: weights, routed experts and visible KV read once at 4.8 TB/s (PERF.md); PERF.md's peers: MoE 1 token" \
  "0.131 ms floor / vLLM 0.163 ms; 64 tokens 3.57 / 3.84 ms." >>"$REPORT"

section "Op-by-op harness"
echo "$ops_tables" >>"$REPORT"

check_result
status=$?
cat "$REPORT"
rm -rf "$WORK" "$INFO"
exit $status
