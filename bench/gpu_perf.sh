#!/usr/bin/env bash
# Every performance row of the GPU issue in one go, ours and PyTorch's side by side, for the GPU machine.
# Usage: bench/gpu_perf.sh [CARRY_DIR]   (default build-cuda-carry; made by bench/make_carry.sh)
#        PEERS=0 skips the PyTorch peers (when a run of the same day already measured them on the same machine kind);
#        LAYER=0 skips `backend_ops perf layer` (gpu_check.sh runs it too); SERVE_BATCHES (default 1,16,64) and SERVE_PROMPT
#        (8192) size the serving-throughput rows; SYNC=1 runs them again with --no-async-scheduling (the synchronous
#        engine loop, for the A/B of overlapped scheduling).
# Writes $OUT/gpu_perf.md (date, GPU, commit, commands, tables) and $OUT/gpu_perf.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda-carry}
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$BUILD/apps/beamline/beamline
OPS=$PWD/$BUILD/tests/backend_ops/backend_ops
REPORT=$OUT/gpu_perf.md
LOG=$OUT/gpu_perf.log
: >"$LOG"
CARRY=$BUILD source bench/open_carry.sh
source bench/cuda_env.sh

# Runs a command, logging it, and appends the Markdown tables of its output to the report under a heading.
table() {
  local title=$1
  shift
  printf '\n$ %s\n' "$*" >>"$LOG"
  printf '\n## %s\n\n`%s`\n\n' "$title" "$*" >>"$REPORT"
  "$@" 2>>"$LOG" | tee -a "$LOG" | grep -E '^\|' >>"$REPORT" || echo "(failed: see the log)" >>"$REPORT"
}

{
  echo "# GPU performance rows (issue 7)"
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| date | $(date -u '+%Y-%m-%d %H:%M UTC') |"
  echo "| GPU | $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1) |"
  echo "| commit | $(cat "$BUILD/apps/beamline/COMMIT" 2>/dev/null | tr '\n' ' ') |"
  echo "| command | \`bench/gpu_perf.sh $BUILD\` |"
  echo
  echo "Floors: bytes that must be read / 4.8 TB/s, FLOPs / 758 TFLOP/s (PERF.md)."
} >"$REPORT"

table "MoE layer: ours (route + experts, CUDA graph)" "$OPS" perf moe --iterations 30
[ "${PEERS:-1}" = 0 ] || table "MoE layer: PyTorch (route + torch._grouped_mm, eager)" python3 bench/torch_moe_peers.py --iterations 30
table "Paged attention: ours, --dtype bfloat16 (one BF16 rounding of q and P in prefill; decode exact)" \
  "$OPS" perf attention --dtype bfloat16
table "Paged attention: ours, --dtype float32 (q and P as hi, lo and lo2 BF16)" "$OPS" perf attention --dtype float32 --filter prefill
[ "${PEERS:-1}" = 0 ] || table "Attention: PyTorch (SDPA on contiguous KV, flex_attention)" python3 bench/torch_attention_peers.py
table "Dense weights of a decode step (q|k|v, o, dense MLP, LM head): ours, streaming and cuBLAS" "$OPS" perf linear
[ "${PEERS:-1}" = 0 ] || table "Dense weights of a decode step: PyTorch (F.linear in BF16, CUDA graphs)" python3 bench/torch_linear_peers.py
[ "${LAYER:-1}" = 0 ] || table "One full-width decoder layer (attention + MoE), context 4096" "$OPS" perf layer --batch 1,64 --context 4096

# Serving throughput of Beam-1.0's shapes cut to 8 layers (3 dense + 5 MoE, 1 global), random weights on the device.
WORK=$(mktemp -d)
"$BIN" make-model --preset beam-1.0 --layers 8 --no-weights --out "$WORK/beam-1.0-8" >>"$LOG" 2>&1
printf '\n## Serving throughput, beam-1.0 shapes with 8 layers (`beamline serve --load-format dummy`, defaults)\n\n' >>"$REPORT"
printf '\n$ serve_throughput\n' >>"$LOG"
python3 bench/serve_throughput.py "$BIN" "$WORK/beam-1.0-8" --batches "${SERVE_BATCHES:-1,16,64}" \
  --prompt "${SERVE_PROMPT:-8192}" --decode 64 --floor-bytes 8292925440 2>>"$LOG" | tee -a "$LOG" | grep -E '^[|`]' >>"$REPORT" ||
  echo "(failed: see the log)" >>"$REPORT"
if [ "${SYNC:-0}" = 1 ]; then
  printf '\n### The same with `--no-async-scheduling` (each step waits for the previous step'"'"'s tokens)\n\n' >>"$REPORT"
  python3 bench/serve_throughput.py "$BIN" "$WORK/beam-1.0-8" --batches "${SERVE_BATCHES:-1,16,64}" \
    --prompt "${SERVE_PROMPT:-8192}" --decode 64 --floor-bytes 8292925440 --serve-args=--no-async-scheduling 2>>"$LOG" |
    tee -a "$LOG" | grep -E '^[|`]' >>"$REPORT" || echo "(failed: see the log)" >>"$REPORT"
fi
cat >>"$REPORT" <<'NOTE'

Step floor: the bytes a batch-1 decode step must read at 4.8 TB/s (attention and dense weights, 8 routed experts per
MoE layer, the LM head; 8,292,925,440 bytes). Prefill's GEMM-FLOP floor is 67.1 ms per 8192 tokens (122K tokens/s).
NOTE
rm -rf "$WORK"
cat "$REPORT"
