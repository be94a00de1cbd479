#!/usr/bin/env bash
# Issue 16's served check on the H200, in one call: `beamline serve` with CUDA (the defaults: bfloat16, decode graphs,
# beam-nano's dflash drafter with adaptive verification, whose plain steps are launched ahead) with the Harmony template constraint on (the default, with jump-forward) and off
# (--no-harmony-constraint), side by side, and bench/structured_overhead.py's chat workload (two tools, temperature 0)
# at batch 1 and 64: tokens/s of each, the constrained server's against the unconstrained one's (goal: within 5% at
# batch 64). MODEL=beam-nano (default; its trained weights) or beam-1.0-8 (Beam-1.0's shapes cut to 8 layers,
# `make-model --no-weights`, `--load-format dummy`: random weights, so both servers mostly run to max_tokens).
# CONFIGS (default off,on,on-no-jump-forward): the third has the constraint's masks without jump-forward's draft rows,
# so its batches have the unconstrained server's shape; the script's second table says why each output differs.
# ROUNDS (default 25): batches of 64 take ~0.15-0.2 s each, so a 5% comparison needs many interleaved rounds; the
# table gives the rates' 25th-75th percentiles and the per-round paired ratio.
# SERVE_ARGS: more flags for every server, e.g. "--speculative-config none" (no drafter: every step may be launched
# ahead; with the default drafter only adaptive verification's plain steps are).
# BATCH_INVARIANT=1 adds --batch-invariant to every server (outputs then depend on no batch shape); BATCH_INVARIANT=both
# runs the comparison without it, then with it (twice the time).
# Writes $OUT/table-MODEL.md (and table-MODEL-batch-invariant.md), the servers' machine and commit in $OUT/machine.txt.
# Usage: [MODEL=beam-nano|beam-1.0-8] [CONFIGS=off,on,...] [ROUNDS=25] [SERVE_ARGS=...] [BATCH_INVARIANT=1|both]
#        bench/gpu_structured_batch64.sh CARRY_DIR   (CARRY_DIR from bench/make_carry.sh)
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

serve_args="--device cuda ${SERVE_ARGS:-}"
if [ "$model" = beam-1.0-8 ]; then
  "$exe" make-model --preset beam-1.0 --layers 8 --no-weights --out /tmp/beam-1.0-8 > "$out/make-model.log" 2>&1
  serve_args="$serve_args --model /tmp/beam-1.0-8 --load-format dummy"
fi
case "${BATCH_INVARIANT:-}" in
  "") modes=plain ;;
  1) modes=batch-invariant ;;
  both) modes="plain batch-invariant" ;;
  *) echo "BATCH_INVARIANT: 1 or both, not '$BATCH_INVARIANT'" >&2; exit 2 ;;
esac
for mode in $modes; do
  args=$serve_args table="$out/table-$model.md"
  if [ "$mode" = batch-invariant ]; then
    args="$serve_args --batch-invariant" table="$out/table-$model-batch-invariant.md"
  fi
  echo "## $model, $mode; every server: $args" | tee "$table"
  python3 bench/structured_overhead.py "$exe" --batches 1,64 --rounds "${ROUNDS:-25}" --max-tokens 160 \
    --configs "${CONFIGS:-off,on,on-no-jump-forward}" --serve-args "$args" | tee -a "$table"
done
