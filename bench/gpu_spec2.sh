#!/usr/bin/env bash
# One GPU call for adaptive verification and the cheaper drafted steps: the block drafter's tests on CUDA (required,
# BEAMLINE_REQUIRE_CUDA=1: a skipped CUDA instance fails), then beam-nano's decode throughput without speculation,
# with dflash at fixed K = 7 and with adaptive verification (bench/dflash_throughput.py) at batch 1, 4, 16 and 64.
# Run from the repository root with the carry folder made as bench/README.md says (beamline and test_block_drafter,
# stripped, tests.tar.xz; dflash_throughput.py; heldout.jsonl: held-out conversations of tools/data/generate.py).
#   OUT=DIR bash CARRY/gpu_spec2.sh CARRY
set -uo pipefail
CARRY=$(cd "${1:?usage: gpu_spec2.sh CARRY_DIR}" && pwd)
OUT=${OUT:?set OUT}
export BEAMLINE_REQUIRE_CUDA=1 BEAMLINE_SOURCE_DIR=$PWD BEAMLINE_EXE=$CARRY/apps/beamline/beamline
source bench/open_carry.sh
BIN=$BEAMLINE_EXE source bench/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
cat "$CARRY/apps/beamline/COMMIT" | tee -a "$OUT/gpu.txt"
TESTS=$(mktemp -d)
tar -xJf "$CARRY/tests.tar.xz" -C "$TESTS"
start=$SECONDS
for test in "$TESTS"/tests/test_*; do
  timeout 120 "$test" >"$OUT/$(basename "$test").log" 2>&1
  rc=$?
  echo "$(basename "$test"): exit $rc" | tee -a "$OUT/tests.txt"
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|random dflash|PASSED' "$OUT/$(basename "$test").log"
done
echo "tests: $((SECONDS - start)) s"
start=$SECONDS
python3 "$CARRY/dflash_throughput.py" "$BEAMLINE_EXE" --model models/beam-nano --drafter models/beam-nano-drafter \
  --batches 1,4,16,64 --decode 256 --rounds 4 --heldout "$CARRY/heldout.jsonl" >"$OUT/throughput.md" \
  2>"$OUT/throughput.log"
echo "throughput: exit $? in $((SECONDS - start)) s"
cat "$OUT/throughput.md"
grep -iE "adaptive|error|fail" "$OUT/throughput.log" | head -20
