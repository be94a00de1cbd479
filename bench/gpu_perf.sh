#!/usr/bin/env bash
# Every performance row of the GPU issue in one go, ours and PyTorch's side by side, for the GPU machine.
# Usage: bench/gpu_perf.sh [CARRY_DIR]   (default build-cuda-carry; made by bench/make_carry.sh)
# Writes $OUT/gpu_perf.md (date, GPU, commit, commands, tables) and $OUT/gpu_perf.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda-carry}
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$BUILD/apps/beamline/beamline
REPORT=$OUT/gpu_perf.md
LOG=$OUT/gpu_perf.log
: >"$LOG"
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

table "MoE layer: ours (route + experts, CUDA graph)" "$BIN" bench-moe --iterations 30
table "MoE layer: PyTorch (route + torch._grouped_mm, eager)" python3 bench/torch_moe_peers.py --iterations 30
table "Paged attention: ours" "$BIN" bench-attention
table "Attention: PyTorch (SDPA on contiguous KV, flex_attention)" python3 bench/torch_attention_peers.py
table "Dense weights of a decode step (q|k|v, o, dense MLP, LM head): ours, streaming and cuBLAS" "$BIN" bench-linear
table "Dense weights of a decode step: PyTorch (F.linear in BF16, CUDA graphs)" python3 bench/torch_linear_peers.py
table "One full-width decoder layer (attention + MoE), context 4096" "$BIN" bench-layer --batch 1,64 --context 4096

# Decode step of Beam-1.0's shapes cut to 8 layers (3 dense + 5 MoE, 1 global), random weights on the device.
printf '\n## Decode step and prefill, beam-1.0 shapes with 8 layers, batch 1 (`beamline generate`, dummy weights)\n\n' >>"$REPORT"
prompt=$(python3 -c "import random; r = random.Random(3); print(','.join(str(r.randrange(200000)) for _ in range(8192)))")
printf '\n$ generate beam-1.0 8 layers, 8192-token prompt, 64 new tokens\n' >>"$LOG"
"$BIN" generate --model beam-1.0 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' --device cuda \
  --kv-cache-dtype bfloat16 --tokens "$prompt" --max-tokens 64 --ignore-eos >>"$LOG" 2>&1
line=$(grep -E 'prefill [0-9]+ tokens in' "$LOG" | tail -1)
python3 - "$line" >>"$REPORT" <<'EOF'
import re, sys
m = re.search(r"prefill (\d+) tokens in ([\d.]+) s; decoded (\d+) tokens in ([\d.]+) s", sys.argv[1])
if not m:
    print("(generate failed: see the log)")
    sys.exit()
prompt, prefill_s, decoded, decode_s = int(m[1]), float(m[2]), int(m[3]), float(m[4])
H, V, HQ, HKV, D, I_DENSE, I_MOE, E, K = 5120, 201088, 48, 8, 128, 20480, 2560, 256, 8
BF16 = 2  # bytes per weight
attention = H * (HQ * D + 2 * HKV * D) + HQ * D * H  # parameters of q, k, v, o
dense = 3 * H * I_DENSE
expert = 3 * H * I_MOE
router = E * H  # per MoE layer, F32 (4 bytes per parameter)
# Batch 1 reads 8 experts per MoE layer, the LM head whole, one row of the embedding.
weights_step = BF16 * (8 * attention + 3 * dense + 5 * K * expert + V * H) + 4 * 5 * router
step_ms = decode_s / decoded * 1e3
floor_ms = weights_step / 4.8e12 * 1e3
print("| work | measured | floor | floor / measured |")
print("| --- | --- | --- | --- |")
print(f"| decode step, batch 1 (context ~8K, host sampling included) | {step_ms:.3f} ms | {floor_ms:.3f} ms (weights read once) | {floor_ms / step_ms:.2f} |")
all_weights = BF16 * (8 * attention + 3 * dense + 5 * E * expert + V * H) + 4 * 5 * router
flops = 2 * prompt * (8 * attention + 3 * dense + 5 * K * expert) + 2 * V * H  # GEMMs; logits of the last position
prefill_floor_s = max(flops / 758e12, all_weights / 4.8e12)
print(f"| prefill {prompt} tokens, batch 1 | {prefill_s * 1e3:.1f} ms ({prompt / prefill_s:.0f} tokens/s) | {prefill_floor_s * 1e3:.1f} ms (GEMM FLOPs / 758 TFLOP/s, attention excluded) | {prefill_floor_s / prefill_s:.3f} |")
EOF
cat "$REPORT"
