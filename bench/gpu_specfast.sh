#!/usr/bin/env bash
# One GPU call for the cost of a drafted step (docs/speculative-decoding.md, "Cost of a drafted step"): the speculative
# decoding tests on CUDA (BEAMLINE_REQUIRE_CUDA=1: a skipped CUDA instance fails), then beam-nano's decode throughput
# without speculation, with dflash at fixed K = 7 and with adaptive verification (bench/dflash_throughput.py --phases:
# a server per row, each logging the engine's step-phase table, plain steps against drafted ones) on the v1 held-out
# prompts the model and its drafter were trained on (bench/data/beam-nano-v1-heldout-prompts.jsonl), at batch 1
# (16 requests in turn) and 4, 16, 64 (4 in turn per slot); last, batch 1 again with --enforce-eager and
# BEAMLINE_CUDA_OP_TIMES=1, whose op table splits the drafted step's device time by op (the drafter pass op by op).
# Run from the repository root with the carry made by `bench/make_carry.sh --tests build CARRY`:
#   OUT=DIR bash bench/gpu_specfast.sh CARRY
# Writes $OUT/tests.txt and a log per test program, $OUT/throughput-b1.md, $OUT/throughput.md, $OUT/op-times.md and the
# servers' logs under $OUT/logs*.
set -uo pipefail
CARRY=$(cd "${1:?usage: gpu_specfast.sh CARRY_DIR}" && pwd)
OUT=${OUT:?set OUT}
source bench/open_carry.sh
export LD_LIBRARY_PATH="$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BEAMLINE_REQUIRE_CUDA=1 BEAMLINE_SOURCE_DIR=$PWD BEAMLINE_EXE=$CARRY/apps/beamline/beamline
BIN=$BEAMLINE_EXE source bench/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
tee -a "$OUT/gpu.txt" <"$CARRY/apps/beamline/COMMIT"
TESTS=$(mktemp -d)
tar -xJf "$CARRY/tests.tar.xz" -C "$TESTS" || { echo "cannot unpack $CARRY/tests.tar.xz" >&2; exit 1; }
start=$SECONDS
for name in test_block_drafter test_context_features test_speculative_decoding test_adaptive_verification \
            test_decode_graphs test_engine_tiny_model; do
  timeout 240 "$TESTS/tests/$name" >"$OUT/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/tests.txt"
  grep -E '^\[ +(FAILED|SKIPPED) +\]|RecordedPasses|random dflash|PASSED' "$OUT/$name.log"
done
echo "tests: $((SECONDS - start)) s"

throughput() {  # OUTPUT_NAME LOG_DIR ARGS...
  local name=$1 logs=$2
  shift 2
  mkdir -p "$logs"
  start=$SECONDS
  python3 bench/dflash_throughput.py "$BEAMLINE_EXE" --model models/beam-nano --drafter models/beam-nano-drafter \
    --decode 256 --phases --log-dir "$logs" "$@" >"$OUT/$name" 2>"$logs/throughput.log"
  echo "$name: exit $? in $((SECONDS - start)) s"
  cat "$OUT/$name"
}
throughput throughput-b1.md "$OUT/logs-b1" --batches 1 --rounds 16
throughput throughput.md "$OUT/logs" --batches 4,16,64 --rounds 4
(export BEAMLINE_CUDA_OP_TIMES=1
 throughput op-times-throughput.md "$OUT/logs-op-times" --batches 1 --rounds 4 --serve-args "--enforce-eager")
# The backend's op table (logged when each server closes), per configuration.
for log in "$OUT"/logs-op-times/serve-*.log; do
  echo "### $(basename "$log" .log) (--enforce-eager, BEAMLINE_CUDA_OP_TIMES=1)"
  grep -A80 'cuda backend: device time per op' "$log" | grep -E '^\||device time per op' | sed 's/^.*cuda backend: //'
  echo
done | tee "$OUT/op-times.md"
