#!/usr/bin/env bash
# Issue 14's two kernels closest to their goals, swept in one GPU call (bench/results/2026-12-03-tune14.md): each
# variant first against the CPU reference (the op harness), then timed next to its floor.
#  - FP8 KV decode attention (goal >= 85% of the roof at B=32 L=8K and B=1 L=128K): BEAMLINE_CUDA_DECODE_ATTENTION
#    unset (query-rows), =query-rows-pdl, =query-rows-pairs and =query-rows-2-blocks, and the plan's splits times 2
#    and 4 (BEAMLINE_CUDA_DECODE_SPLITS; 3x is there too, not swept); checks: the harness's kv_decode group (--small,
#    but the full group, 32K keys, for the 7-stage versions, whose ring only wraps around in the long cases); timing:
#    `perf attention --kv-cache-dtype fp8 --filter "decode global" --graph`.
#  - One-token MoE of FP8 / MXFP8 / NVFP4 experts (goals: FP8 <= 0.085 ms, MXFP8 within 5% of FP8, NVFP4 <= 1.2x its
#    floor): BEAMLINE_CUDA_TOKEN_MOE unset (staged), =staged-wide, =staged-wide5, =staged-cvt, =staged-half-cvt;
#    checks: the fp8, mxfp8 and nvfp4 groups at small widths, then (with what is left) at Beam-1.0's widths for the
#    new versions; timing: `perf fp8 --no-linear` and `perf micro`, --tokens 1,16 (route + experts, CUDA graph).
# The summary table (stdout and $OUT/tune14-summary.md): variant, case, ms, floor ms, % of floor, checks.
# Usage: bench/gpu_tune14.sh CARRY_DIR   (CARRY_DIR from `bench/make_carry.sh build CARRY_DIR`); writes $OUT/tune14.log
#        (every command's whole output), $OUT/perf-*.txt (each perf table) and $OUT/tune14-summary.md; exits 1 when a
#        check failed or did not run or a perf row is missing. At most 115 s once the machine is up (the attention
#        sweep gets the first 70 s, the MoE sweep the rest; each step's limit is cut to what is left). ATTENTION_S and
#        TOTAL_S change the two (session 10's 70 / 115 left the MoE variants' full-width checks unfinished).
set -uo pipefail
CARRY=${1:?usage: bench/gpu_tune14.sh CARRY_DIR}
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/tune14.log
SUMMARY=$OUT/tune14-summary.md
STEPS=,all,
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
unset BEAMLINE_CUDA_DECODE_ATTENTION BEAMLINE_CUDA_DECODE_SPLITS BEAMLINE_CUDA_TOKEN_MOE
source bench/gpu_steps.sh
log_header
problems=()
table=()  # the summary's rows

# checks LABEL SECONDS ENV... -- HARNESS ARGS...: the harness's test mode under the variables; sets `checked` to its
# count line ("N cases, 0 failed") or what went wrong.
checks() {
  local label=$1 limit
  limit=$(limit_of "$2")
  shift 2
  local -a variables=()
  while [ "$1" != -- ]; do variables+=("$1"); shift; done
  shift
  checked="not run (budget)"
  echo "--- checks: $label"
  if [ "$limit" -le 0 ]; then problems+=("$label: checks not run (the budget was spent)"); return; fi
  step "$limit" 'FAIL|cases,' env "${variables[@]}" "$OPS" test --device cuda "$@"
  checked=$(grep -oE '^[0-9]+ cases, [0-9]+ failed$' "$OUT/step.txt" | tail -1)
  [ -n "$checked" ] || checked="did not finish"
  [[ $checked =~ ^[1-9][0-9]*\ cases,\ 0\ failed$ ]] || problems+=("$label: checks $checked")
}
# timed LABEL SECONDS FILE ENV... -- PERF ARGS...: one perf run under the variables, its output kept in FILE.
timed() {
  local label=$1 limit file=$3
  limit=$(limit_of "$2")
  shift 3
  local -a variables=()
  while [ "$1" != -- ]; do variables+=("$1"); shift; done
  shift
  echo "--- perf: $label"
  : >"$file"
  if [ "$limit" -le 0 ]; then problems+=("$label: perf not run (the budget was spent)"); return; fi
  step "$limit" '^\| ' env "${variables[@]}" "$OPS" perf "$@"
  cp "$OUT/step.txt" "$file"
}
# row VARIANT CASE MS FLOOR CHECKS GOAL: one summary row (% of floor = floor / ms), or a problem when ms is missing.
row() {
  local percent="—"
  if [ -z "$3" ]; then
    problems+=("$1: no '$2' row")
  else
    percent=$(awk -v f="$4" -v t="$3" 'BEGIN { printf "%.0f%%", 100 * f / t }')
  fi
  table+=("| $1 | $2 | ${3:-missing} | $4 | $percent | $5 | $6 |")
}

echo "=== FP8 KV decode attention: version and splits variants"
budget=${ATTENTION_S:-70}
# name, BEAMLINE_CUDA_DECODE_ATTENTION, BEAMLINE_CUDA_DECODE_SPLITS, harness flags
attention_variants=(
  "query-rows (default)||auto|--small"
  "query-rows-pdl|query-rows-pdl|auto|--small"
  "query-rows-pairs|query-rows-pairs|auto|"
  "query-rows-2-blocks|query-rows-2-blocks|auto|"
  "query-rows, splits 2x||2x|--small"
  "query-rows, splits 4x||4x|--small"
)
attention_cases=("B=1 L=128K|>= 85%" "B=32 L=8K|>= 85%" "B=128 L=4K|(85%)" "B=1 L=1M|(85%)" "B=1 L=8K|")
seed=41
for entry in "${attention_variants[@]}"; do
  IFS='|' read -r name version splits flags <<<"$entry"
  variables=("BEAMLINE_CUDA_DECODE_ATTENTION=$version" "BEAMLINE_CUDA_DECODE_SPLITS=$splits")
  # shellcheck disable=SC2086  # flags: empty or --small
  checks "$name" 25 "${variables[@]}" -- $flags --filter kv_decode --seed $((seed++))
  file=$OUT/perf-attention-${name//[^a-z0-9-]/_}.txt
  timed "$name" 20 "$file" "${variables[@]}" -- attention --kv-cache-dtype fp8 --filter "decode global" --graph
  for shape in "${attention_cases[@]}"; do
    IFS='|' read -r case goal <<<"$shape"
    # | decode global B=1 L=128K | ms | MB | TB/s | floor ms | % |
    ms="" floor=""
    read -r ms floor < <(awk -F'|' -v c="decode global $case" \
      '{ gsub(/^ +| +$/, "", $2) } $2 == c { gsub(/ /, "", $3); gsub(/ /, "", $6); print $3, $6; exit }' "$file")
    row "$name" "FP8 KV decode $case" "${ms:-}" "${floor:-}" "$checked" "$goal"
  done
done

echo "=== one-token MoE, FP8 / MXFP8 / NVFP4 experts: staged kernel shapes"
budget=${TOTAL_S:-115}
moe_variants=("staged (default)|" "staged-wide|staged-wide" "staged-wide5|staged-wide5" "staged-cvt|staged-cvt"
  "staged-half-cvt|staged-half-cvt")
seed=51
for entry in "${moe_variants[@]}"; do
  IFS='|' read -r name version <<<"$entry"
  variables=("BEAMLINE_CUDA_TOKEN_MOE=$version")
  checks "$name" 20 "${variables[@]}" -- --small --filter fp8,mxfp8,nvfp4 --seed $((seed++))
  moe_checked=$checked
  tag=${name//[^a-z0-9-]/_}
  timed "$name: FP8" 20 "$OUT/perf-fp8-$tag.txt" "${variables[@]}" -- fp8 --no-linear --tokens 1,16 --iterations 30
  timed "$name: MXFP8, NVFP4" 25 "$OUT/perf-micro-$tag.txt" "${variables[@]}" -- micro --tokens 1,16 --iterations 30
  for tokens in 1 16; do
    # perf fp8: | tokens | experts hit | ms | route ms | floor ms (bytes) | floor ms (FLOPs) | floor / time | ...
    ms="" floor=""
    read -r ms floor < <(awk -F'|' -v t="$tokens" \
      '{ for (i = 2; i <= 6; ++i) gsub(/ /, "", $i) } $2 == t && $3 ~ /^[0-9]+$/ { print $4, $6; exit }' \
      "$OUT/perf-fp8-$tag.txt")
    goal=""
    [ "$tokens" = 1 ] && goal="<= 0.085 ms"
    row "$name" "FP8 MoE, $tokens token(s)" "${ms:-}" "${floor:-}" "$moe_checked" "$goal"
    for format in mxfp8 nvfp4; do
      # perf micro: | format | tokens | experts hit | floor ms (route + experts) | ms (graph) | time / floor | ...
      ms="" floor=""
      read -r ms floor < <(awk -F'|' -v f="$format" -v t="$tokens" \
        '{ for (i = 2; i <= 6; ++i) gsub(/ /, "", $i) } $2 == f && $3 == t { print $6, $5; exit }' \
        "$OUT/perf-micro-$tag.txt")
      goal=""
      [ "$tokens" = 1 ] && goal=$([ $format = mxfp8 ] && echo "<= 1.05x FP8's" || echo "<= 1.2x floor")
      row "$name" "${format^^} MoE, $tokens token(s)" "${ms:-}" "${floor:-}" "$moe_checked" "$goal"
    done
  done
done
# The new versions at Beam-1.0's widths (staged-wide5's FP8 and MXFP8 blocks there take 226 KB of shared memory), with
# what is left of the budget.
for version in staged-wide5 staged-half-cvt staged-cvt staged-wide; do
  checks "$version, Beam-1.0 widths" 40 "BEAMLINE_CUDA_TOKEN_MOE=$version" -- --filter fp8,mxfp8,nvfp4 --seed $((seed++))
  table+=("| $version | fp8, mxfp8, nvfp4 groups at Beam-1.0's widths | | | | $checked | |")
done
rm -f "$OUT/step.txt"

{
  echo
  echo "| variant | case | ms | floor ms | % of floor | checks | goal |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${table[@]}"
  echo
  echo "Before (H200, be4e313, bench/results/2026-12-03-session9-final.md): FP8 KV decode query-rows 74% at B=1 L=128K,"
  echo "78% at B=32 L=8K, 76% at B=128 L=4K, 86% at 1M; MoE 1 token FP8 0.1141 ms, MXFP8 0.1279, NVFP4 0.1167 (3.07x)."
} | tee -a "$LOG" | tee -a "$SUMMARY"
if [ ${#problems[@]} -gt 0 ]; then
  printf 'PROBLEM: %s\n' "${problems[@]}"
  exit 1
fi
echo "every check passed and every perf row came out"
