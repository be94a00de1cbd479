#!/usr/bin/env bash
# One GPU call for speculative decoding's speed goals (issue 15: >= 1.8x no speculation at batch 16, adaptive >= 1.10x
# fixed K at 64, never slower than no speculation from 1 to 256; bench/results/2026-12-03-spec15.md, after
# 2026-12-03-specblock.md):
# 1. Tests with BEAMLINE_REQUIRE_CUDA=1 (a skipped CUDA instance fails): verify steps of 3 and 4 sequences replaying
#    one recorded graph (test_verify_graphs), the drafter's block attention and recorded passes, and the speculative
#    decoding programs (greedy outputs equal to no speculation).
# 2. beamline serve's output throughput (bench/dflash_throughput.py --phases: a server per row, each with its
#    step-phase table, plain and drafted steps with and without prompt rows apart, and its counts of recorded and
#    replayed graphs) without speculation, with dflash at fixed K = 7 and with adaptive verification, on the v1
#    held-out prompts, at batches $BATCHES (default 1,16,64,128,256) with $ROUNDS requests per slot (default
#    24,12,8,6,4: ~3 s of the unspeculated server per batch) after one unmeasured round, for each set of $SETS:
#      new     this branch as it runs by default
#      nohold  this branch with BEAMLINE_PROMPT_HOLD_STEPS=0 (new prompts enter decode steps at once, as before)
#      before  BEFORE_CARRY's binary (main before the branch), when given
#    Estimated device time (from session 9's walls, bench/results/2026-12-03-session9-final): ~40 s of tests, ~60 s
#    per set (15 servers of ~1.5 s start-up, ~37 s measured and warm-up); SETS="new nohold" ~160 s, with before ~220 s.
# Run from the repository root with carries made by bench/make_carry.sh:
#   bench/make_carry.sh --tests build .carry && bench/make_carry.sh /work/main/build .carry-before
#   OUT=DIR bash bench/gpu_specblock.sh .carry [.carry-before]
# Writes $OUT/tests.txt (a log per program), $OUT/throughput-SET.md per set, and the servers' logs under $OUT/logs-*.
set -uo pipefail
CARRY=$(cd "${1:?usage: gpu_specblock.sh CARRY [BEFORE_CARRY]}" && pwd)
BEFORE=${2:+$(cd "$2" && pwd)}
OUT=${OUT:?set OUT}
SETS=${SETS:-new nohold}
BATCHES=${BATCHES:-1,16,64,128,256}
ROUNDS=${ROUNDS:-24,12,8,6,4}
source bench/open_carry.sh
if [ -n "$BEFORE" ]; then (CARRY=$BEFORE; source bench/open_carry.sh); fi
export LD_LIBRARY_PATH="$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BEAMLINE_REQUIRE_CUDA=1 BEAMLINE_SOURCE_DIR=$PWD BEAMLINE_EXE=$CARRY/apps/beamline/beamline
BIN=$BEAMLINE_EXE source bench/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
tee -a "$OUT/gpu.txt" <"$CARRY/apps/beamline/COMMIT"
[ -n "$BEFORE" ] && { printf 'before: '; cat "$BEFORE/apps/beamline/COMMIT"; } | tee -a "$OUT/gpu.txt"

start=$SECONDS
TESTS=$(mktemp -d)
tar -xJf "$CARRY/tests.tar.xz" -C "$TESTS" || { echo "cannot unpack $CARRY/tests.tar.xz" >&2; exit 1; }
for name in test_verify_graphs test_block_drafter test_paged_attention test_adaptive_verification \
            test_speculative_decoding test_scheduler test_decode_graphs test_context_features test_engine_tiny_model; do
  timeout 300 "$TESTS/tests/$name" >"$OUT/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/tests.txt"
  grep -E '^\[ +(FAILED|SKIPPED) +\]|PASSED' "$OUT/$name.log"
done
echo "tests: $((SECONDS - start)) s"

throughput() {  # BINARY OUTPUT_NAME LOG_DIR
  local binary=$1 name=$2 logs=$3
  mkdir -p "$logs"
  start=$SECONDS
  timeout 240 python3 bench/dflash_throughput.py "$binary" --model models/beam-nano --drafter models/beam-nano-drafter \
    --decode 256 --phases --log-dir "$logs" --batches "$BATCHES" --rounds "$ROUNDS" --warmup-rounds 1 \
    >"$OUT/$name" 2>"$logs/throughput.log"
  echo "$name: exit $? in $((SECONDS - start)) s"
  sed -n '/^| speculation/,/^$/p' "$OUT/$name"
}
for set in $SETS; do
  case $set in
    new) binary=$BEAMLINE_EXE; hold= ;;
    nohold) binary=$BEAMLINE_EXE; hold=0 ;;
    before) [ -n "$BEFORE" ] || continue; binary=$BEFORE/apps/beamline/beamline; hold= ;;
    *) echo "unknown set $set" >&2; continue ;;
  esac
  (if [ -n "$hold" ]; then export BEAMLINE_PROMPT_HOLD_STEPS=$hold; else unset BEAMLINE_PROMPT_HOLD_STEPS; fi
   [ "$set" = before ] && export LD_LIBRARY_PATH="$BEFORE/apps/beamline/lib:$LD_LIBRARY_PATH"
   throughput "$binary" "throughput-$set.md" "$OUT/logs-$set")
done
echo "done in $SECONDS s"
