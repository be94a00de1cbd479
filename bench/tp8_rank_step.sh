#!/usr/bin/env bash
# One TP8 rank of Beam-1.0, timed on one H200: the decode step of the shapes a rank holds when the full 52-layer model
# is split eight ways (issue 19's "scale on paper"), with random weights drawn on the device. Two splits of the MoE:
#   tp8     MoE tensor-parallel: all 256 experts, each expert's intermediate 2560/8 = 320 (every rank reads 1/8 of each
#           routed expert: balanced at any batch);
#   ep8-kK  expert-parallel: 32 whole experts per rank, routed K per token (K models the load of the busiest rank).
# Attention: 48/8 = 6 query heads and 8/8 = 1 KV head; dense MLP 20480/8; LM head 201088/8 rows (vocabulary-parallel).
# The collectives between ranks are not in these timings: docs/parallel.md's projection adds them.
# Usage: bench/tp8_rank_step.sh BINARY [BATCHES]    (writes Markdown to stdout; needs the GPU)
#        QUANTIZATION=fp8 (or mxfp8, nvfp4) serves the rank's projections quantized (`--quantization`, dummy weights);
#        SPLITS (default tp8,ep8-k1,ep8-k3) picks the splits; PROFILE_DIR=DIR adds each split's per-kernel device time
#        of one batch-1 decode step (bench/decode_step_profile.py, needs Nsight Systems), traces under DIR; OP_TIMES=1
#        adds each split's device time per op, decoded op by op (`generate`, BEAMLINE_CUDA_OP_TIMES=1: no Nsight needed).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$1
BATCHES=${2:-1,16,64}
WORK=$(mktemp -d)
"$BIN" make-model --preset beam-1.0 --no-weights --out "$WORK/beam-1.0" >/dev/null

# Writes a rank's config.json: the full model's with the per-rank sizes of one split.
rank_config() {
  local name=$1 experts=$2 moe_intermediate=$3 experts_per_token=$4 groups=$5 topk_groups=$6
  mkdir -p "$WORK/$name"
  cp "$WORK/beam-1.0/"* "$WORK/$name/"
  python3 - "$WORK/beam-1.0/config.json" "$WORK/$name/config.json" "$experts" "$moe_intermediate" \
    "$experts_per_token" "$groups" "$topk_groups" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
experts, moe_intermediate, per_token, groups, topk_groups = map(int, sys.argv[3:])
config.update(num_attention_heads=config["num_attention_heads"] // 8, num_key_value_heads=config["num_key_value_heads"] // 8,
              intermediate_size=config["intermediate_size"] // 8, vocab_size=config["vocab_size"] // 8,
              n_routed_experts=experts, moe_intermediate_size=moe_intermediate, num_experts_per_tok=per_token,
              n_group=groups, topk_group=topk_groups)
# Special token ids must lie inside the rank's slice of the vocabulary for the config to load.
for key in ("bos_token_id", "pad_token_id"):
    config[key] = 0
config["eos_token_id"] = [1]
json.dump(config, open(sys.argv[2], "w"), indent=2)
generation_path = sys.argv[2].replace("config.json", "generation_config.json")
generation = json.load(open(generation_path))
generation.update({key: 0 for key in ("bos_token_id", "pad_token_id") if key in generation})
generation["eos_token_id"] = [1]
json.dump(generation, open(generation_path, "w"), indent=2)
EOF
}

QUANTIZATION=${QUANTIZATION:-}
SERVE_ARGS=${QUANTIZATION:+--quantization $QUANTIZATION}

# Bytes one decode step of a rank must read at batch 1 (F32 router, BF16 LM head; projections in BF16 or in
# QUANTIZATION's bytes per weight with its scales): its floor at 4.8 TB/s.
floor_bytes() {
  python3 - "$1" "$QUANTIZATION" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
# Bytes per weight of a projection, scales included: fp8 one F32 scale per 128x128 block, mxfp8 one E8M0 byte per
# 32 weights, nvfp4 half a byte plus one E4M3 byte per 16 weights.
per_weight = {"": 2.0, "fp8": 1.0 + 4.0 / (128 * 128), "mxfp8": 1.0 + 1.0 / 32, "nvfp4": 0.5 + 1.0 / 16}[sys.argv[2]]
h, d = c["hidden_size"], c["head_dim"]
attention = (h * (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * d + c["num_attention_heads"] * d * h) * per_weight
dense = 3 * h * c["intermediate_size"] * per_weight
moe = c["num_experts_per_tok"] * 3 * h * c["moe_intermediate_size"] * per_weight + c["n_routed_experts"] * h * 4
layers, dense_layers = c["num_hidden_layers"], c["first_k_dense_replace"]
print(int(layers * attention + dense_layers * dense + (layers - dense_layers) * moe + c["vocab_size"] * h * 2))
EOF
}

echo "# One TP8 rank's decode step (Beam-1.0, 52 layers, per-rank shapes, dummy weights)"
echo
echo "| | |"
echo "| --- | --- |"
echo "| date | $(date -u '+%Y-%m-%d %H:%M UTC') |"
echo "| GPU | $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) |"
echo "| commit | $(cat "$(dirname "$BIN")/COMMIT" 2>/dev/null | tr '\n' ' ') |"
echo "| command | \`QUANTIZATION=$QUANTIZATION bench/tp8_rank_step.sh BIN $BATCHES\` |"
SPLITS=,${SPLITS:-tp8,ep8-k1,ep8-k3},
for split in "tp8 256 320 8 8 4" "ep8-k1 32 2560 1 1 1" "ep8-k3 32 2560 3 1 1"; do
  set -- $split
  [[ $SPLITS == *,$1,* ]] || continue
  rank_config "$@"
  echo
  echo "## $1 (experts $2, moe_intermediate_size $3, routed per token $4${QUANTIZATION:+, $QUANTIZATION})"
  echo
  python3 bench/serve_throughput.py "$BIN" "$WORK/$1" --batches "$BATCHES" --prompt 512 --decode 64 \
    --floor-bytes "$(floor_bytes "$WORK/$1/config.json")" --serve-args="$SERVE_ARGS" | grep -E '^[|`]'
  if [ -n "${OP_TIMES:-}" ]; then
    echo
    echo "### $1: device time per op, decode op by op (\`generate\`, 16-token prompt, 128 tokens, BEAMLINE_CUDA_OP_TIMES=1)"
    echo
    BEAMLINE_CUDA_OP_TIMES=1 "$BIN" generate --model "$WORK/$1" --load-format dummy --device cuda $SERVE_ARGS \
      --tokens 2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17 --max-tokens 128 --ignore-eos 2>&1 |
      grep -E '^\||device time per op' | sed -E 's/^\[[^]]*\] \[[a-z]+\] //'
  fi
  if [ -n "${PROFILE_DIR:-}" ]; then
    echo
    echo "### $1: device time per kernel of one batch-1 decode step"
    echo
    python3 bench/decode_step_profile.py "$BIN" "$WORK/$1" --out "$PROFILE_DIR/$1" --batches 1 --prompt 512 \
      --decode 64 --serve-args "$SERVE_ARGS" | grep -E '^[|`]'
  fi
done
