#!/usr/bin/env bash
# Issue 16's served check on the H200, in one call: `beamline serve` with CUDA (the defaults: bfloat16, async scheduling,
# decode graphs) with the Harmony template constraint on (the default, with jump-forward) and off
# (--no-harmony-constraint), side by side, and bench/structured_overhead.py's chat workload (two tools, temperature 0)
# at batch 1 and 64: tokens/s of each, the constrained server's against the unconstrained one's (goal: within 5% at
# batch 64). MODEL=beam-nano (default; its trained weights) or beam-1.0-8 (Beam-1.0's shapes cut to 8 layers,
# `make-model --no-weights`, `--load-format dummy`: random weights, so both servers mostly run to max_tokens).
# Writes $OUT/table-MODEL.md, the servers' machine and commit in $OUT/machine.txt.
# Usage: [MODEL=beam-nano|beam-1.0-8] [CONFIGS=off,on] bench/gpu_structured_batch64.sh CARRY_DIR
#        (CARRY_DIR from bench/make_carry.sh)
set -euo pipefail
carry=$(realpath "${1:?usage: gpu_structured_batch64.sh CARRY_DIR}")
out=${OUT:?set OUT}
model=${MODEL:-beam-nano}
cd "$(dirname "$0")/.."
CARRY=$carry source bench/open_carry.sh
exe=$carry/apps/beamline/beamline
BIN=$exe source bench/cuda_env.sh
cat "$carry/apps/beamline/COMMIT" > "$out/machine.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >> "$out/machine.txt"
nproc >> "$out/machine.txt"
echo "model: $model" >> "$out/machine.txt"

serve_args="--device cuda"
if [ "$model" = beam-1.0-8 ]; then
  "$exe" make-model --preset beam-1.0 --layers 8 --no-weights --out /tmp/beam-1.0-8 > "$out/make-model.log" 2>&1
  serve_args="--device cuda --model /tmp/beam-1.0-8 --load-format dummy"
fi
python3 bench/structured_overhead.py "$exe" --batches 1,64 --rounds 5 --max-tokens 160 \
  --configs "${CONFIGS:-off,on}" --serve-args "$serve_args" | tee "$out/table-$model.md"
