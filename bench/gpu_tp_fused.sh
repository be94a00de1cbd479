#!/usr/bin/env bash
# Issue 19: the fused all-reduce + residual add + RMSNorm in the tensor-parallel forward (parallel/fused_all_reduce_norm.h),
# checked and timed in one device call, on one H200 (two ranks sharing it: CUDA_VISIBLE_DEVICES=0,0 for the TP2 runs,
# the staged all-reduce instead of NCCL, which refuses two ranks on one GPU) or on two (nvidia-h200-x2: NCCL), as many as
# the machine has. Steps (STEPS, comma-separated; default both):
#   logits  `beamline logits` (one prefill of 48 tokens: 48 rows, under the fused kernel's 64) of TP2 with
#           BEAMLINE_FUSED_ALLREDUCE_NORM=always (every sandwich norm fused) and =never (the all-reduce, then the
#           separate norm) against TP1 and against each other: float32 (--dtype float32, F32 KV: relative error
#           <= 1e-5, argmax >= 99%) and bfloat16 (argmax >= 99%), on the tiny preset (a checkpoint) and on Beam-1.0's
#           shapes cut to 4 layers (--load-format dummy: 3 dense layers and 1 MoE layer, hidden 5,120). Each fused run's
#           log must count 2 fused launches per layer, each unfused run's must say that it did not fuse.
#   timing  serve_throughput.py: the decode step of Beam-1.0 cut to 8 layers (4 on one GPU; --load-format dummy,
#           bfloat16) at batch 1, 16 and 64 under TP1, TP2 unfused (never) and TP2 fused (always; `auto` takes the same
#           path up to 64 rows of 5,120), and their ratio. On one GPU the two ranks share it (time-sliced: the fused
#           kernel's handshake waits for the other rank's turn) and the unfused path goes through host memory:
#           informational only.
# Usage: bench/gpu_tp_fused.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh: apps/beamline/beamline inside)
#        DEVICE=cpu SMALL=1 bench/gpu_tp_fused.sh BUILD_DIR: the dry run here (the CPU backend has no fused path, so
#        its launch counts are informational; the tiny preset for every model, few tokens). Writes $OUT/gpu_tp_fused.md
#        (the report) and $OUT/gpu_tp_fused.log. The exit status is 0 only when every check ran and passed.
# Time (estimate): logits 12 runs, ~150 s on two GPUs; timing 3 serve runs, ~200 s.
set -uo pipefail
CARRY=$(realpath "${1:?usage: bench/gpu_tp_fused.sh CARRY_DIR [STEPS]}")
STEPS=,${2:-logits,timing},
cd "$(dirname "$0")/.." || exit 1
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$GPUS" -ge 1 ] 2>/dev/null || GPUS=1
[ "$GPUS" -le 2 ] || GPUS=2
NAME=gpu_tp_fused TITLE="Fused all-reduce + norm in the TP2 forward on $GPUS GPU(s): checked and timed (issue 19)"
SMALL_NOTE="tiny preset, few tokens"
source bench/multi_gpu_start.sh
# The TP2 runs' environment: on one GPU both ranks take GPU 0 (MpiWorld::use_local_gpu reads their entries).
tp2_env=()
[ "$DEVICE" != cuda ] || [ "$GPUS" != 1 ] || tp2_env=("CUDA_VISIBLE_DEVICES=0,0")
# Two ranks on one GPU: each its own KV budget (--gpu-memory-utilization would let both take what the other has not
# yet), and Beam-1.0 cut to 4 layers for the timing (8 layers' ~100 GB of weights leave two ranks too little room).
memory=() timing_layers=8
if [ "$DEVICE" = cuda ] && [ "$GPUS" = 1 ]; then memory=(--kv-cache-memory 8G) timing_layers=4; fi
if [ "${SMALL:-0}" = 1 ]; then
  beam=(--model tiny --load-format dummy --hf-overrides '{"num_hidden_layers": 4}') beam_vocab=512 layers=4
  timing_preset=(--preset small --layers 2) prompt=128 decode=48
else
  beam=(--model beam-1.0 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}') beam_vocab=201088 layers=4
  timing_preset=(--preset beam-1.0 --layers "$timing_layers") prompt=2048 decode=64
fi
if wanted timing; then
  "$BIN" make-model "${timing_preset[@]}" --no-weights --out "$WORK/timing-model" >"$WORK/make-model.log" 2>&1 &
  maker=$!
fi
token_ids() {  # count, vocabulary size
  python3 -c "import random; r = random.Random(19); print(','.join(str(r.randrange(min($2, 100000))) for _ in range($1)))"
}

# One `beamline logits` run: TAG, DTYPE, TOKENS, then env assignments and flags. Its log is $WORK/TAG.log.
logits_run() {
  local tag=$1 dtype=$2 tokens=$3
  shift 3
  printf '\n$ %s\n' "$*" >>"$LOG"
  env "$@" --tokens "$tokens" --device "$DEVICE" --dtype "$dtype" --kv-cache-dtype "$dtype" --out "$WORK/$tag.npy" \
    >"$WORK/$tag.log" 2>&1
  local status=$?
  cat "$WORK/$tag.log" >>"$LOG"
  return $status
}
# The fused launches a run's log counts (FusedAllReduceNorm logs them when the run ends), or "none".
fused_launches() { grep -o 'fused all-reduce + norm: [0-9]* launches' "$1" | grep -o '[0-9]*' | tail -1 || true; }

if wanted logits; then
  models=()
  if logged "$BIN" make-model --preset tiny --out "$WORK/tiny" --seed 7; then
    models+=("tiny preset|6|512|--model $WORK/tiny")
  else
    check_row "make-model tiny (its logits rows did not run)" failed "exit 0" 0
  fi
  models+=("${beam[1]} cut to $layers layers, dummy|$layers|$beam_vocab|${beam[*]}")
  for model in "${models[@]}"; do
    IFS='|' read -r name model_layers vocab flags <<<"$model"
    # shellcheck disable=SC2206  # the flags are split as written above (the JSON holds no space but after ':')
    [ "$flags" = "${beam[*]}" ] && model_args=("${beam[@]}") || model_args=($flags)
    tokens=$(token_ids 48 "$vocab")
    for dtype in float32 bfloat16; do
      tag=$(echo "$name-$dtype" | tr -c 'a-zA-Z0-9-' _)
      mode=$([ "$dtype" = float32 ] && echo parallel || echo parallel-bf16)
      logits_run "$tag-tp1" "$dtype" "$tokens" "$BIN" logits "${model_args[@]}" ||
        check_row "logits TP1, $name, $dtype" "exit $?: see the log" "exit 0" 0
      for path in always never; do
        logits_run "$tag-$path" "$dtype" "$tokens" "${tp2_env[@]}" BEAMLINE_FUSED_ALLREDUCE_NORM=$path "$BIN" logits \
          "${model_args[@]}" --tensor-parallel-size 2 || check_row "logits TP2 $path, $name, $dtype" "exit $?: see the log" "exit 0" 0
        row="logits TP2 $([ $path = always ] && echo fused || echo unfused) vs TP1, $name, --dtype $dtype"
        checks_from "$row" 1 python3 bench/compare_logits.py "$mode" "$WORK/$tag-$path.npy" "$WORK/$tag-tp1.npy" "$row"
      done
      row="logits TP2 fused vs unfused, $name, --dtype $dtype"
      checks_from "$row" 1 python3 bench/compare_logits.py "$mode" "$WORK/$tag-always.npy" "$WORK/$tag-never.npy" "$row"
      fused=$(fused_launches "$WORK/$tag-always.log") unfused=$(fused_launches "$WORK/$tag-never.log")
      counted="fused run ${fused:-none}, unfused run ${unfused:-none}"
      owed="fused run $((2 * model_layers)) (2 per layer), unfused none"
      if [ "$DEVICE" = cuda ]; then
        check_row "fused launches counted, $name, --dtype $dtype" "$counted" "$owed" \
          "$([ "${fused:-0}" = $((2 * model_layers)) ] && [ -z "$unfused" ] && echo 1 || echo 0)"
      else
        info_row "fused launches counted, $name, --dtype $dtype (the CPU backend has no fused path)" "$counted"
      fi
    done
  done
fi

summary=""
if wanted timing; then
  if wait "$maker"; then
    tables=()
    for layout in "TP1|||" "TP2 unfused|never|--tensor-parallel-size 2|tp2" "TP2 fused|always|--tensor-parallel-size 2|tp2"; do
      IFS='|' read -r label path serve_args tp2 <<<"$layout"
      run_env=()
      [ -z "$path" ] || run_env=("BEAMLINE_FUSED_ALLREDUCE_NORM=$path")
      [ -z "$tp2" ] || run_env+=("${tp2_env[@]}")
      [ -z "$tp2" ] || serve_args="$serve_args ${memory[*]}"
      echo "\$ timing $label" >>"$LOG"
      table=$(step 300 '^[|`]|Error|error|assert' env "${run_env[@]}" python3 bench/serve_throughput.py "$BIN" \
        "$WORK/timing-model" --batches 1,16,64 --prompt "$prompt" --decode "$decode" --device "$DEVICE" \
        --serve-args "$serve_args")
      rows=$(echo "$table" | grep -cE '^\| [0-9]+ \|')
      why=$(echo "$table" | grep -m1 -E 'rror|assert' | sed 's/\x1b\[[0-9;]*m//g; s/|/\//g' | cut -c1-220)
      check_row "decode step timed, $label (serve_throughput.py, batches 1, 16, 64)" \
        "$rows of 3 batch rows${why:+; first error: $why}" "3 rows" "$([ "$rows" = 3 ] && echo 1 || echo 0)"
      tables+=("$label|$(echo "$table" | grep -E '^\| [0-9]+ \|' | tr '\n' '#')")
      summary="$summary
### $label

$(echo "$table" | grep -E '^[|`]')
"
    done
    # fused / unfused per batch, from the "ms per decode step" column (the fifth).
    ratios=$(printf '%s\n' "${tables[@]}" | python3 -c '
import sys
steps = {}
for line in sys.stdin:
    label, _, rows = line.rstrip("\n").partition("|")
    for row in filter(None, rows.split("#")):
        cells = [c.strip() for c in row.strip("|").split("|")]
        steps.setdefault(label, {})[cells[0]] = float(cells[4])
print("| batch | TP1 ms | TP2 unfused ms | TP2 fused ms | fused / unfused |")
print("| --- | --- | --- | --- | --- |")
for batch in steps.get("TP2 fused", {}):
    one, unfused, fused = (steps.get(k, {}).get(batch) for k in ("TP1", "TP2 unfused", "TP2 fused"))
    ratio = f"{fused / unfused:.3f}" if fused and unfused else "-"
    print(f"| {batch} | {one} | {unfused} | {fused} | {ratio} |")' 2>>"$LOG")
  else
    check_row "decode step timings" "make-model ${timing_preset[*]} --no-weights failed: $(tail -1 "$WORK/make-model.log")" \
      "" "not run"
  fi
fi

if [ "$DEVICE" != cuda ]; then
  info_row "machine" "the CPU backend (a dry run): both paths are the MPI all-reduce and the separate norm"
elif [ "$GPUS" = 1 ]; then
  info_row "machine" "1 GPU: the two ranks share it (time-sliced) and the unfused all-reduce goes through host memory (NCCL refuses two ranks on one GPU): the timings are informational"
else
  info_row "machine" "2 GPUs: the unfused all-reduce is NCCL's"
fi
info_row "crossover" "kFusedAllReduceMaxBytes (parallel/fused_all_reduce_norm.h): 64 rows x 5,120 x 4 B, from one GPU's local measurement; the two-GPU table below is what should set it"
info_section

if wanted timing; then
  section "Timings: the decode step (serve_throughput.py, --load-format dummy, bfloat16, BF16 KV; prompt $prompt, decode $decode)"
  echo "${ratios:-no ratios: see the tables and the log}" >>"$REPORT"
  echo "$summary" >>"$REPORT"
fi

check_result
status=$?
cat "$REPORT"
rm -rf "$WORK" "$INFO" "$OUT/step.txt"
exit $status
