#!/usr/bin/env bash
# The 8-layer Beam-1.0 decode step (issue 21) of two builds side by side, for the GPU machine: the harness's checks of
# the ops a step fuses (the new build), then per build the step time at each batch size (bench/serve_throughput.py, 8K
# prompts, decode graphs) and, where Nsight Systems is installed, each kernel's device time in one decode step
# (bench/decode_step_profile.py).
# Usage: bench/gpu_decode_step.sh BASE_CARRY NEW_CARRY   (each made by bench/make_carry.sh from one build)
#        BATCHES (default 1,16,64), PROMPT (8192), DECODE (64); PROFILE=0 skips the traces; TESTS (the harness
#        families checked in float32, default rms_norm,rope,route,moe,linear_many,swiglu).
# Writes $OUT/decode_step.md (date, GPU, commits, commands, tables), $OUT/decode_step.log, and per build the traces
# and kernel lists under $OUT/<base|new>/.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: bench/gpu_decode_step.sh BASE_CARRY NEW_CARRY}
NEW=${2:?usage: bench/gpu_decode_step.sh BASE_CARRY NEW_CARRY}
OUT=${OUT:-$(mktemp -d)}
REPORT=$OUT/decode_step.md
LOG=$OUT/decode_step.log
: >"$LOG"
for carry in "$BASE" "$NEW"; do CARRY=$carry source bench/open_carry.sh; done
source bench/cuda_env.sh
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
BATCHES=${BATCHES:-1,16,64} PROMPT=${PROMPT:-8192} DECODE=${DECODE:-64}

{
  echo "# 8-layer Beam-1.0 decode step, base against new (issue 21)"
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| date | $(date -u '+%Y-%m-%d %H:%M UTC') |"
  echo "| GPU | $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1) |"
  echo "| base | $(tr '\n' ' ' <"$BASE/apps/beamline/COMMIT") |"
  echo "| new | $(tr '\n' ' ' <"$NEW/apps/beamline/COMMIT") |"
  echo "| command | \`bench/gpu_decode_step.sh $BASE $NEW\` (BATCHES=$BATCHES PROMPT=$PROMPT DECODE=$DECODE) |"
  echo "| nsys | ${NSYS:-not found: no per-kernel tables} |"
  echo
  echo "Step floor: the 8,292,925,440 bytes a batch-1 step must read, at 4.8 TB/s (1.73 ms)."
} >"$REPORT"

# Correctness first: a build whose fused ops disagree with the CPU is not worth timing. The families in float32
# (FP32-accurate tolerances), the projections and MLPs in bfloat16, and the batch-invariant mode's rows.
TESTS=${TESTS:-rms_norm,rope,route,moe,linear_many,swiglu}
printf '\n## Harness checks of the new build (cuda against cpu)\n\n' >>"$REPORT"
for run in "float32|--filter $TESTS" "bfloat16|--filter linear_many,moe,swiglu,route" \
           "bfloat16|--batch-invariant --filter batch_invariance"; do
  dtype=${run%%|*} args=${run#*|}
  timeout 300 "$NEW/tests/backend_ops/backend_ops" test --device cuda --reference cpu --dtype "$dtype" $args \
    >"$OUT/test.txt" 2>&1
  echo "\`backend_ops test --device cuda --reference cpu --dtype $dtype $args\`: exit $?" >>"$REPORT"
  cat "$OUT/test.txt" >>"$LOG"
  grep -E "cases, .* failed|\| fail" "$OUT/test.txt" | head -20 >>"$REPORT"
  echo >>"$REPORT"
done

WORK=$(mktemp -d)
"$NEW/apps/beamline/beamline" make-model --preset beam-1.0 --layers 8 --no-weights --out "$WORK/beam-1.0-8" >>"$LOG" 2>&1
for version in base new; do
  carry=$([ $version = base ] && echo "$BASE" || echo "$NEW")
  bin=$PWD/$carry/apps/beamline/beamline
  printf '\n## %s (%s): step time, `serve --load-format dummy`, decode graphs\n\n' $version \
    "$(tr '\n' ' ' <"$carry/apps/beamline/COMMIT")" >>"$REPORT"
  printf '\n$ serve_throughput %s\n' $version >>"$LOG"
  timeout 420 python3 bench/serve_throughput.py "$bin" "$WORK/beam-1.0-8" --batches "$BATCHES" --prompt "$PROMPT" \
    --decode "$DECODE" --floor-bytes 8292925440 2>>"$LOG" | tee -a "$LOG" | grep -E '^[|`]' >>"$REPORT" ||
    echo "(failed: see the log)" >>"$REPORT"
  if [ "${PROFILE:-1}" = 1 ] && [ -n "$NSYS" ]; then
    printf '\n### %s: device time per kernel in one decode step\n' $version >>"$REPORT"
    printf '\n$ decode_step_profile %s\n' $version >>"$LOG"
    timeout 480 python3 bench/decode_step_profile.py "$bin" "$WORK/beam-1.0-8" --out "$OUT/$version" --nsys "$NSYS" \
      --batches "$BATCHES" --prompt "$PROMPT" --decode "$DECODE" 2>>"$LOG" | tee -a "$LOG" >>"$REPORT" ||
      echo "(failed: see the log)" >>"$REPORT"
    # The traces stay for a closer look; their SQLite exports are large and can be made again from them.
    rm -f "$OUT/$version"/*.sqlite
  fi
done
rm -rf "$WORK"
cat "$REPORT"
