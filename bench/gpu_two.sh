#!/usr/bin/env bash
# Issue 17 in one device call on nvidia-h200-x2: tensor, expert and data parallelism over two GPUs, checked and timed.
# Steps (STEPS, comma-separated; default all three):
#   logits  `beamline logits` of TP2 (--tensor-parallel-size 2), EP2 (the same with --enable-expert-parallel) and
#           DP2+EP2 (--data-parallel-size 2 --enable-expert-parallel) against TP1 on the same machine, in float32
#           (--dtype float32, F32 KV: relative error <= 1e-5, argmax >= 99%) and bfloat16 (argmax >= 99%), on the tiny
#           preset (a checkpoint) and on Beam-1.0's shapes cut to 8 layers (--load-format dummy: every rank draws
#           its slices of the same weights); then the 8-layer model's three layouts with --quantization fp8 against
#           TP1 in FP8, bfloat16 (each rank quantizes its part at load and slices it, docs/parallel.md, Quantized
#           weights); 15 rows, through compare_logits.py's `parallel` modes.
#   serve   parallel_serve_check.py on the small preset under TP2, float32: 32 concurrent requests = one at a time
#           (100%), = one process (>= 90% of first-16-token answers); the last worker killed while 4 requests stream:
#           the server exits naming the rank, every stream ends with an error, none hangs. 4 rows.
#   timing  the 8-layer Beam-1.0 decode step at batch 1, 16, 64 (8K prompts) and prefill tokens/s, under one GPU, TP2
#           and EP2 (serve_throughput.py, --load-format dummy, the defaults: bfloat16, BF16 KV), next to the
#           weights' floor of a batch-1 step split evenly over the GPUs (collectives not in the floor). A row per
#           layout in the Checks table says its table was printed whole.
# Not measured, because beamline has no way to time them: the NCCL all-reduce and all-to-all alone at decode sizes
# (1-256 tokens x 5120) and prefill sizes (no collective case in backend_ops perf, and the NCCL communicator runs on
# its own stream, outside BEAMLINE_CUDA_OP_TIMES), so NCCL's own figures (nccl-tests) are not beside them; the fused
# all-reduce + RMSNorm against NCCL (bench/gpu_tp_fused.sh does that). The official-client chat test under TP2 is CTest's
# parallel_serve_e2e (node), not run here. The results file says so too.
# Time on 2 x H200 (estimate): logits 16 runs ~130 s, serve ~60 s, timing 3 x ~60 s: ~400 s, inside one 600 s call.
# If it does not fit, split into `logits,serve` and `timing` (two calls, each writing its own report).
# Usage: bench/gpu_two.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh: apps/beamline/beamline inside)
#        DEVICE=cpu SMALL=1 bench/gpu_two.sh BUILD_DIR: the dry run here (ranks as processes on the CPU backend, the
#        tiny preset for the logits and serving models and the small one cut to 2 layers for the timings, few tokens,
#        short prompts; the same steps and rows). Writes $OUT/gpu_two.md
#        (the report), $OUT/gpu_two.log and $OUT/serve.log. The exit status is 0 only when every check ran and passed.
set -uo pipefail
CARRY=$(realpath "${1:?usage: bench/gpu_two.sh CARRY_DIR [STEPS]}")
STEPS=,${2:-logits,serve,timing},
cd "$(dirname "$0")/.."
NAME=gpu_two GPUS=2 TITLE="Two GPUs: TP2, EP2 and DP2+EP2 checked and timed (issue 17)"
SMALL_NOTE="tiny preset, few tokens"
source bench/multi_gpu_start.sh
if [ "${SMALL:-0}" = 1 ]; then
  serve_preset=tiny tiny_tokens=24 beam_tokens=24 prompt=128 decode=48 serve_limit=300
  beam=(--model tiny --load-format dummy --hf-overrides '{"num_hidden_layers": 4}')
  # The small preset cut to 2 layers: one tiny process on the CPU is so fast that its streamed tokens arrive a few to
  # a chunk, too few chunk times for serve_throughput.py's window.
  timing_preset=(--preset small --layers 2)
else
  serve_preset=small tiny_tokens=96 beam_tokens=256 prompt=8192 decode=64 serve_limit=240
  beam=(--model beam-1.0 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}')
  timing_preset=(--preset beam-1.0 --layers 8)
fi
# The timing model's directory (config and Beam-1.0's 201K-token synthetic tokenizer, ~40 s of one core) is written
# while the checks run.
if wanted timing; then
  "$BIN" make-model "${timing_preset[@]}" --no-weights --out "$WORK/timing-model" >"$WORK/make-model.log" 2>&1 &
  maker=$!
fi

# Random token ids below the vocabulary (and below 100000: ids of ordinary text).
token_ids() {  # count, vocabulary size
  python3 -c "import random; r = random.Random(17); print(','.join(str(r.randrange(min($2, 100000))) for _ in range($1)))"
}
layouts=("TP2|--tensor-parallel-size 2" "EP2|--tensor-parallel-size 2 --enable-expert-parallel"
         "DP2+EP2|--data-parallel-size 2 --enable-expert-parallel")

if wanted logits; then
  if logged "$BIN" make-model --preset tiny --out "$WORK/tiny" --seed 7; then
    models=("tiny preset|$tiny_tokens|512|--model $WORK/tiny")
  else
    check_row "make-model tiny (its logits rows did not run)" failed "exit 0" 0
    models=()
  fi
  if [ "${SMALL:-0}" = 1 ]; then
    models+=("tiny cut to 4 layers, --load-format dummy|$beam_tokens|512|")
  else
    models+=("Beam-1.0 cut to 8 layers, --load-format dummy|$beam_tokens|201088|")
  fi
  for model in "${models[@]}"; do
    IFS='|' read -r name count vocab flags <<<"$model"
    # shellcheck disable=SC2206
    model_args=($flags)
    [ -n "$flags" ] || model_args=("${beam[@]}")
    tokens=$(token_ids "$count" "$vocab")
    for dtype in float32 bfloat16; do
      tag=$(echo "$name-$dtype" | tr -c 'a-zA-Z0-9-' _)
      parallel_logits_rows "$name, $count tokens" "$tag" "$dtype" "$tokens" "${layouts[@]}"
    done
  done
  model_args=("${beam[@]}" --quantization fp8)
  IFS='|' read -r name count vocab flags <<<"${models[-1]}"
  parallel_logits_rows "$name --quantization fp8, $count tokens" fp8-bfloat16 bfloat16 "$(token_ids "$count" "$vocab")" \
    "${layouts[@]}"
fi

if wanted serve; then
  if logged "$BIN" make-model --preset "$serve_preset" --out "$WORK/serve-$serve_preset" --seed 7; then
    checks_from "parallel_serve_check.py ($serve_preset preset, 4 rows)" 4 timeout "$serve_limit" \
      python3 bench/parallel_serve_check.py "$BIN" "$WORK/serve-$serve_preset" "$DEVICE" --log "$OUT/serve.log"
  else
    check_row "parallel_serve_check.py ($serve_preset preset)" "make-model failed" "" "not run"
  fi
fi

timings=""
if wanted timing; then
  if wait "$maker"; then
    # Bytes a batch-1 decode step must read: the active parameters but the embedding (one row of it is read), BF16.
    floor=$("$BIN" make-model --config "$WORK/timing-model/config.json" --dry-run | python3 -c "
import json, sys
values = dict(line.split(': ', 1) for line in sys.stdin if line.startswith(('active parameters per token', 'bytes')))
config = json.load(open('$WORK/timing-model/config.json'))
print(2 * (int(values['active parameters per token']) - config['vocab_size'] * config['hidden_size']))")
    for layout in "one GPU|" "${layouts[@]:0:2}"; do
      label=${layout%%|*}
      serve_args=${layout#*|}
      gpus=$([ -z "$serve_args" ] && echo 1 || echo 2)
      echo "\$ timing $label" >>"$LOG"
      table=$(step 300 '^[|`]|Error|error|assert' python3 bench/serve_throughput.py "$BIN" "$WORK/timing-model" \
        --batches 1,16,64 --prompt "$prompt" --decode "$decode" --device "$DEVICE" --floor-bytes $((floor / gpus)) \
        --serve-args "$serve_args")
      rows=$(echo "$table" | grep -cE '^\| [0-9]+ \|')
      why=$(echo "$table" | grep -m1 -E 'rror|assert' | sed 's/\x1b\[[0-9;]*m//g; s/|/\//g' | cut -c1-220)
      check_row "decode step and prefill timed, $label (serve_throughput.py, batches 1, 16, 64)" \
        "$rows of 3 batch rows${why:+; first error: $why}" "3 rows" "$([ "$rows" = 3 ] && echo 1 || echo 0)"
      timings="$timings
### $label

$(echo "$table" | grep -E '^[|`]')
"
    done
  else
    check_row "decode step timings" "make-model ${timing_preset[*]} --no-weights failed: $(tail -1 "$WORK/make-model.log")" \
      "" "not run"
  fi
fi

info_row "NCCL all-reduce and all-to-all alone, decode sizes (1-256 x 5120) and prefill sizes" \
  "not measured: beamline has no way to time a collective alone (no collective case in backend_ops perf; the NCCL communicator runs on its own stream, outside BEAMLINE_CUDA_OP_TIMES), and nccl-tests are not carried"
info_row "fused all-reduce + RMSNorm against NCCL + separate norm" "not here: bench/gpu_tp_fused.sh checks and times it (TP2 here takes the default, BEAMLINE_FUSED_ALLREDUCE_NORM=never: NCCL, then the norm)"
info_row "official-client chat test against a TP2 server" "not run here: CTest's parallel_serve_e2e (node and the openai package)"
info_section

if wanted timing; then
  section "Timings: the decode step and prefill (serve_throughput.py, --load-format dummy, --dtype auto: bfloat16 and BF16 KV on the GPU, float32 on the CPU)"
  echo "The floor column: the weights of a batch-1 step ($floor bytes) at 4.8 TB/s, divided evenly over the GPUs" \
    "(expert parallelism reads the experts of the busiest GPU, more than half at batch 1; collectives not counted)." \
    "Batch 16 and 64 read more experts than batch 1: the floor column is batch 1's." >>"$REPORT"
  echo "$timings" >>"$REPORT"
fi

check_result
status=$?
cat "$REPORT"
rm -rf "$WORK" "$INFO" "$OUT/step.txt"
exit $status
