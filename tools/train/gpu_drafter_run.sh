#!/usr/bin/env bash
# One call on the GPU machine: checks the PyTorch drafter against the NumPy one on a random drafter, generates the
# target's greedy completions, trains the block drafter, checks the trained drafter torch-vs-numpy, and measures
# acceptance on held-out turns at K = block_size - 1 (greedy). Leaves under $OUT: beam-nano-drafter/{config.json,
# model.safetensors}, report.json (training and acceptance figures), log.txt.
#   OUT=/some/dir [TARGET=models/beam-nano] tools/train/gpu_drafter_run.sh [training seconds, default 140]
#       [generation seconds, default 35]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
seconds=${1:-140}
gen_seconds=${2:-35}
target=${TARGET:-models/beam-nano}
export PYTHONUNBUFFERED=1
{
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
  python3 tools/reference/check_drafter.py --target "$target" \
    || echo "WARNING: random drafter torch-vs-numpy check failed"
  python3 tools/train/train_drafter.py --target "$target" --out "$OUT/beam-nano-drafter" --seconds "$seconds" \
    --gen-seconds "$gen_seconds" --json "$OUT/report.json" || echo "ERROR: train_drafter.py failed"
  python3 tools/reference/check_drafter.py --target "$target" --drafter "$OUT/beam-nano-drafter" --device cuda \
    --tokens 200 --anchors 0,1,57,150,199 || echo "WARNING: trained drafter torch-vs-numpy check failed"
} 2>&1 | tee "$OUT/log.txt"
