#!/usr/bin/env bash
# One GPU call for the drafter's block attention and the rest of branch specblock (bench/results/2026-12-03-specblock.md):
# 1. Tests with BEAMLINE_REQUIRE_CUDA=1 (a skipped CUDA instance fails): backend_ops' block_attention cases (the CUDA
#    kernel against the CPU op on random inputs) and the speculative decoding test programs.
# 2. beamline serve's decode throughput (bench/dflash_throughput.py --phases: a server per row, each with its step-phase
#    table) without speculation, with dflash at fixed K = 7 and with adaptive verification, on the v1 held-out prompts,
#    at batch 1 (16 requests in turn) and 4, 16, 64 (4 in turn per slot), for each set of $SETS:
#      new     this branch as it runs by default (one block_attention per draft layer)
#      rows    this branch with BEAMLINE_DRAFTER_ATTENTION=rows (the drafter's attention as B one-row paged_attention
#              calls per layer, as before; everything else the branch's)
#      before  BEFORE_CARRY's binary (main before the branch), when given
#    and, last, batch 1 with --enforce-eager and BEAMLINE_CUDA_OP_TIMES=1 for new and rows: the device time per op
#    (block_attention against the 24 paged_attention calls of a pass).
# Run from the repository root with carries made by bench/make_carry.sh:
#   bench/make_carry.sh --tests build .carry && bench/make_carry.sh /work/main/build .carry-before
#   OUT=DIR bash bench/gpu_specblock.sh .carry .carry-before
# Writes $OUT/tests.txt (a log per program), $OUT/block_attention.md, $OUT/throughput-SET-b1.md and
# $OUT/throughput-SET.md per set, $OUT/op-times.md, and the servers' logs under $OUT/logs-*.
set -uo pipefail
CARRY=$(cd "${1:?usage: gpu_specblock.sh CARRY [BEFORE_CARRY]}" && pwd)
BEFORE=${2:+$(cd "$2" && pwd)}
OUT=${OUT:?set OUT}
SETS=${SETS:-new rows before}
source bench/open_carry.sh
if [ -n "$BEFORE" ]; then (CARRY=$BEFORE; source bench/open_carry.sh); fi
export LD_LIBRARY_PATH="$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BEAMLINE_REQUIRE_CUDA=1 BEAMLINE_SOURCE_DIR=$PWD BEAMLINE_EXE=$CARRY/apps/beamline/beamline
BIN=$BEAMLINE_EXE source bench/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
tee -a "$OUT/gpu.txt" <"$CARRY/apps/beamline/COMMIT"
[ -n "$BEFORE" ] && { printf 'before: '; cat "$BEFORE/apps/beamline/COMMIT"; } | tee -a "$OUT/gpu.txt"

start=$SECONDS
"$CARRY/tests/backend_ops/backend_ops" test --device cuda --filter block_attention >"$OUT/block_attention.md" 2>&1
echo "backend_ops block_attention: exit $?" | tee -a "$OUT/tests.txt"
grep -E 'cases,|FAIL' "$OUT/block_attention.md"
TESTS=$(mktemp -d)
tar -xJf "$CARRY/tests.tar.xz" -C "$TESTS" || { echo "cannot unpack $CARRY/tests.tar.xz" >&2; exit 1; }
for name in test_paged_attention test_block_drafter test_adaptive_verification test_speculative_decoding \
            test_decode_graphs test_context_features test_engine_tiny_model; do
  timeout 300 "$TESTS/tests/$name" >"$OUT/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/tests.txt"
  grep -E '^\[ +(FAILED|SKIPPED) +\]|BlockAttention|RecordedPasses|Uniform|PASSED' "$OUT/$name.log"
done
echo "tests: $((SECONDS - start)) s"

throughput() {  # BINARY OUTPUT_NAME LOG_DIR ARGS...
  local binary=$1 name=$2 logs=$3
  shift 3
  mkdir -p "$logs"
  start=$SECONDS
  python3 bench/dflash_throughput.py "$binary" --model models/beam-nano --drafter models/beam-nano-drafter \
    --decode 256 --phases --log-dir "$logs" "$@" >"$OUT/$name" 2>"$logs/throughput.log"
  echo "$name: exit $? in $((SECONDS - start)) s"
  cat "$OUT/$name"
}
for set in $SETS; do
  case $set in
    new) binary=$BEAMLINE_EXE; attention= ;;
    rows) binary=$BEAMLINE_EXE; attention=rows ;;
    before) [ -n "$BEFORE" ] || continue; binary=$BEFORE/apps/beamline/beamline; attention= ;;
    *) echo "unknown set $set" >&2; continue ;;
  esac
  (export BEAMLINE_DRAFTER_ATTENTION=$attention
   [ "$set" = before ] && export LD_LIBRARY_PATH="$BEFORE/apps/beamline/lib:$LD_LIBRARY_PATH"
   throughput "$binary" "throughput-$set-b1.md" "$OUT/logs-$set-b1" --batches 1 --rounds 16
   throughput "$binary" "throughput-$set.md" "$OUT/logs-$set" --batches 4,16,64 --rounds 4)
done
for set in new rows; do
  (export BEAMLINE_CUDA_OP_TIMES=1 BEAMLINE_DRAFTER_ATTENTION=$([ $set = rows ] && echo rows)
   throughput "$BEAMLINE_EXE" "op-times-$set-throughput.md" "$OUT/logs-op-times-$set" --batches 1 --rounds 4 \
     --serve-args "--enforce-eager")
done
# The backend's op table (logged when each server closes), per configuration.
for log in "$OUT"/logs-op-times-*/serve-*.log; do
  echo "### $(basename "$(dirname "$log")") $(basename "$log" .log) (--enforce-eager, BEAMLINE_CUDA_OP_TIMES=1)"
  grep -A80 'cuda backend: device time per op' "$log" | grep -E '^\||device time per op' | sed 's/^.*cuda backend: //'
  echo
done | tee "$OUT/op-times.md"
