#!/usr/bin/env bash
# Issue 21's performance goals in one GPU call: every row the issue tracks, ours next to PyTorch's (the peers that run
# on the GPU machine; vLLM does not), the roofs that bound them and where a decode step's and a prefill's time goes,
# all measured in the same call; then bench/perf_goals.py puts one row per goal at the top of the report: measured,
# goal, met or short by how much, the peer, and the measured limit. Steps (STEPS, comma-separated):
#   roof             `backend_ops perf roof`: the best streaming read per byte count, cuBLAS BF16 GEMMs on the FLOPs
#                    of the MoE layer at 1,024 and 8,192 tokens and of an 8K prefill step (~10 s)
#   moe              `backend_ops perf moe`, bfloat16, 1-8,192 tokens: route + experts as a CUDA graph, route alone
#                    (~20 s)
#   moe-peers        bench/torch_moe_peers.py at the same token counts (~25 s)
#   attention        `backend_ops perf attention --dtype bfloat16`: paged decode (global, B=1 8K-1M, B=32, B=128) as
#                    CUDA graphs, prefill (causal 8K, window-512 32K) as back-to-back calls (~20 s)
#   attention-peers  bench/torch_attention_peers.py: SDPA, flex_attention for the sliding window only (~50 s:
#                    one torch.compile)
#   serve            bench/serve_throughput.py on Beam-1.0 cut to 8 layers, 8K prompts, batches SERVE_BATCHES (1,16;
#                    add 64 for that row, ~30 s more): the decode step and prefill tokens/s (~20 s)
#   op-times         BEAMLINE_CUDA_OP_TIMES=1: serve at batch 1 with an 8K prompt (each decode step's graph replay,
#                    the prefill op by op) and `generate` op by op (each op of a decode step, 16-token context) (~25 s)
#   profile          bench/decode_step_profile.py at batch 1 where Nsight Systems is installed: each kernel of a decode
#                    step and the time between kernels (~70 s)
#   extras (not in the default): attention-f32 (prefill in float32), linear and linear-peers (the decode step's dense
#   weights), layer (one full-width layer), sync (serve again with --no-async-scheduling).
# Usage: bench/gpu_perf.sh [CARRY_DIR] [STEPS]   (default build-cuda-carry, from bench/make_carry.sh; STEPS default
#        roof,moe,moe-peers,attention,attention-peers,serve,op-times,profile: an estimated 170 s on one H200, 240 s with
#        the Nsight Systems profile; not yet timed there)
#        BUDGET (default 420 s): each step gets its own limit or what is left of the budget, a step past it is not
#        run (and its goal rows say so); PEERS=0 drops the PyTorch steps; SERVE_BATCHES (1,16), SERVE_PROMPT (8192).
#        DEVICE=cpu SMALL=1 bench/gpu_perf.sh BUILD_DIR [STEPS]: the dry run here, without a GPU: every step runs (the
#        device-only ones fail at once; serve and op-times on the tiny preset, 256-token prompts), and the goal table
#        renders with every row "not run".
# Writes $OUT/gpu_perf.md (the goal table, then each step's command and tables, then the steps' exit status and
# seconds), $OUT/gpu_perf.log (everything), $OUT/perf/ (each step's output; perf_goals.py reads them) and
# $OUT/perf_goals.json. Exit status: perf_goals.py's, 1 when a goal row or its limit did not run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CARRY=${1:-build-cuda-carry}
STEPS=,${2:-roof,moe,moe-peers,attention,attention-peers,serve,op-times,profile},
if [ "${PEERS:-1}" = 0 ]; then
  for peers in moe-peers attention-peers linear-peers; do STEPS=${STEPS//,$peers,/,}; done
fi
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
REPORT=$OUT/gpu_perf.md
LOG=$OUT/gpu_perf.log
RAW=$OUT/perf
BODY=$RAW/body.md
budget=${BUDGET:-420}
mkdir -p "$RAW"
: >"$BODY"
: >"$RAW/steps.tsv"
source bench/open_carry.sh
source bench/gpu_steps.sh
DEVICE=${DEVICE:-cuda}
if [ "${SMALL:-0}" = 1 ]; then
  preset=(--preset tiny) serve_batches=${SERVE_BATCHES:-1,2} serve_prompt=${SERVE_PROMPT:-256} decode=256
else
  source bench/cuda_env.sh
  preset=(--preset beam-1.0 --layers 8) serve_batches=${SERVE_BATCHES:-1,16} serve_prompt=${SERVE_PROMPT:-8192}
  decode=64
fi
header=$(log_header)  # date, commit, GPU (or CPU cores); also the log's first lines
moe_tokens=1,16,64,256,1024,8192
floor_bytes=8292925440  # what a batch-1 decode step of the 8-layer model must read (bench/README.md)

# run_step NAME SECONDS TITLE COMMAND...: the command under its limit (or what is left of the budget), its whole output
# to $RAW/NAME.txt and the log, its tables under TITLE in the report body, and its exit status and seconds in
# steps.tsv (status "budget" when nothing was left to run it).
run_step() {
  local name=$1 limit title=$3 start=$SECONDS status
  limit=$(limit_of "$2")
  shift 3
  local shown
  shown=$(printf '%q ' "$@")
  printf '\n## %s\n\n`%s`\n\n' "$title" "${shown//$PWD\//}" >>"$BODY"
  if [ "$limit" -le 0 ]; then
    echo "not run: the budget of $budget s was spent" >>"$BODY"
    printf '%s\tbudget\t0\t0\n' "$name" >>"$RAW/steps.tsv"
    echo "--- $name: not run (budget spent)"
    return
  fi
  printf '\n$ %s\n' "$*" >>"$LOG"
  timeout "$limit" "$@" >"$RAW/$name.txt" 2>&1
  status=$?
  cat "$RAW/$name.txt" >>"$LOG"
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" "$limit" >>"$RAW/steps.tsv"
  echo "--- $name: exit $status in $((SECONDS - start)) s (limit $limit)"
  # Tables, the serve command line, and the op timer's and profiler's summary lines (without the log prefix).
  grep -E '^\||^`|device time per op|^batch [0-9]+: |^Every configuration|^PyTorch |^torch ' "$RAW/$name.txt" |
    sed -E 's/^.*cuda backend: (device time per op)/\1/' >>"$BODY"
  [ "$status" = 0 ] || echo "(exit $status: see the log)" >>"$BODY"
}

# The model directory (config and the 201K-token synthetic tokenizer, ~40 s of one core) is written meanwhile.
WORK=$(mktemp -d)
MODEL=$WORK/model
"$BIN" make-model "${preset[@]}" --no-weights --out "$MODEL" >"$WORK/make-model.log" 2>&1 &
maker=$!

wanted roof && run_step roof 60 "Roofs of this GPU: the best streaming read per byte count, cuBLAS BF16 GEMMs" \
  "$OPS" perf roof
wanted moe && run_step moe 60 "MoE layer, bfloat16: ours (route + experts as a CUDA graph; route alone)" \
  "$OPS" perf moe --dtype bfloat16 --tokens "$moe_tokens" --iterations 30
wanted moe-peers && run_step moe-peers 120 "MoE layer: PyTorch (route + torch._grouped_mm, eager)" \
  python3 bench/torch_moe_peers.py --tokens "$moe_tokens" --iterations 20
if wanted attention; then
  run_step attention-decode 40 \
    "Paged decode attention, bfloat16: ours (one CUDA graph of each sample's back-to-back calls, as in a decode step)" \
    "$OPS" perf attention --dtype bfloat16 --graph --filter "decode global"
  run_step attention-prefill 40 "Paged prefill attention, bfloat16: ours (back-to-back calls)" \
    "$OPS" perf attention --dtype bfloat16 --filter prefill
fi
wanted attention-peers && run_step attention-peers 150 \
  "Attention: PyTorch (SDPA on contiguous KV; flex_attention for the sliding window)" \
  python3 bench/torch_attention_peers.py --flex-filter window
wanted attention-f32 && run_step attention-f32 30 "Prefill attention, float32 (q and P as three BF16 terms)" \
  "$OPS" perf attention --dtype float32 --filter prefill
wanted linear && run_step linear 60 "Dense weights of a decode step: ours, streaming and cuBLAS" "$OPS" perf linear
wanted linear-peers && run_step linear-peers 90 "Dense weights of a decode step: PyTorch (F.linear, CUDA graphs)" \
  python3 bench/torch_linear_peers.py
wanted layer && run_step layer 60 "One full-width decoder layer (attention + MoE), context 4096" \
  "$OPS" perf layer --batch 1,64 --context 4096

wait "$maker" || { echo "make-model failed:"; tail -5 "$WORK/make-model.log"; }
serve=(python3 bench/serve_throughput.py "$BIN" "$MODEL" --device "$DEVICE" --prompt "$serve_prompt" --decode "$decode"
       --floor-bytes "$floor_bytes")
wanted serve && run_step serve 150 \
  "Serving, make-model ${preset[*]} (\`serve --load-format dummy\`, defaults): decode step and prefill" \
  "${serve[@]}" --batches "$serve_batches"
wanted sync && run_step sync 150 "The same with --no-async-scheduling" \
  "${serve[@]}" --batches "$serve_batches" --serve-args=--no-async-scheduling
if wanted op-times; then
  run_step op-times-serve 60 \
    "Device time per op, serve at batch 1 (decode steps as graph replays, prefill op by op; BEAMLINE_CUDA_OP_TIMES=1)" \
    env BEAMLINE_CUDA_OP_TIMES=1 "${serve[@]}" --batches 1
  run_step op-times-decode 60 \
    "Device time per op, decode op by op (\`generate\`, 16-token prompt, 256 tokens; BEAMLINE_CUDA_OP_TIMES=1)" \
    env BEAMLINE_CUDA_OP_TIMES=1 "$BIN" generate --model "$MODEL" --load-format dummy --device "$DEVICE" \
    --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 --max-tokens 256 --ignore-eos
fi
if wanted profile; then
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  # A traced serve needs a minute and a half at least (start, two 8K prefills, the trace's export); less is not run.
  if [ -n "$NSYS" ] && [ "$DEVICE" = cuda ] && [ "$(limit_of 150)" -lt 90 ]; then
    printf '\n## Each kernel of a batch-1 decode step\n\nnot run: less than 90 s of the budget left\n' >>"$BODY"
    printf 'profile\tbudget\t0\t0\n' >>"$RAW/steps.tsv"
  elif [ -n "$NSYS" ] && [ "$DEVICE" = cuda ]; then
    run_step profile 150 "Each kernel of a batch-1 decode step (Nsight Systems, decode graphs traced node by node)" \
      python3 bench/decode_step_profile.py "$BIN" "$MODEL" --out "$RAW/profile" --nsys "$NSYS" --batches 1 \
      --prompt "$serve_prompt" --decode "$decode"
    rm -f "$RAW/profile"/*.sqlite "$RAW/profile"/*.nsys-rep  # the kernel CSVs stay; the traces are large
  else
    printf '\n## Each kernel of a batch-1 decode step\n\nnot run: no Nsight Systems (nsys) on this machine\n' >>"$BODY"
    printf 'profile\tskipped: no nsys on this machine\t0\t0\n' >>"$RAW/steps.tsv"
  fi
fi
rm -rf "$WORK"

goal_args=("$RAW" --json "$OUT/perf_goals.json")
[ "$DEVICE" = cuda ] || goal_args+=(--dry-run)
python3 bench/perf_goals.py "${goal_args[@]}" >"$RAW/goals.md" 2>>"$LOG"
goals_status=$?
[ "$goals_status" -le 1 ] || echo "(bench/perf_goals.py failed with exit $goals_status: see the log)" >>"$RAW/goals.md"
{
  echo "# GPU performance goals of issue 21"
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| date | $(sed -n 1p <<<"$header") |"
  echo "| machine | $(sed -n 3p <<<"$header") |"
  echo "| commit | $(sed -n 2p <<<"$header") |"
  dry=$([ "$DEVICE" = cuda ] || echo ", DEVICE=$DEVICE SMALL=${SMALL:-0}: a dry run")
  echo "| command | \`bench/gpu_perf.sh $CARRY ${STEPS:1:-1}\` (BUDGET=$budget$dry) |"
  echo "| seconds | $SECONDS |"
  echo
  echo "Floors: bytes that must be read / 4.8 TB/s, FLOPs / 758 TFLOP/s (PERF.md). \"Measured limit\": what bounds the"
  echo "row, measured in this call (the read roof, cuBLAS on the same FLOPs, where the time goes). bench/README.md says"
  echo "how each row is made."
  echo
  cat "$RAW/goals.md"
  cat "$BODY"
  printf '\n## Steps\n\n| step | exit | seconds | limit |\n| --- | --- | --- | --- |\n'
  awk -F'\t' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }' "$RAW/steps.tsv"
  cat <<'NOTE'

Step floor: the bytes a batch-1 decode step must read at 4.8 TB/s (attention and dense weights, 8 routed experts per
MoE layer, the LM head; 8,292,925,440 bytes, 1.73 ms). Prefill's GEMM-FLOP floor is 67.1 ms per 8192 tokens (122K
tokens/s): the projections, dense MLPs and routed experts of the 8 layers, not attention.
NOTE
} >"$REPORT"
cat "$REPORT"
exit "$goals_status"
