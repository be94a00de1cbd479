#!/usr/bin/env bash
# One call on the GPU machine: checks the tokenizer and the PyTorch model against the other readers,
# trains beam-nano, checks the trained checkpoint torch-vs-numpy, evaluates it greedily on the held-out
# turns, and leaves under $OUT: config.json, generation_config.json, harmony.json, model.safetensors split
# into parts below 16 MB (rejoin with `cat model.safetensors.part-* > model.safetensors`), eval.json, log.txt.
#   OUT=/some/dir tools/train/gpu_run.sh [training seconds, default 270]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
seconds=${1:-270}
work=$(mktemp -d /tmp/beam-nano-run.XXXXXX)
export PYTHONUNBUFFERED=1
{
  python3 tools/data/generate.py --out "$work/sample" --train 0 --heldout 300 --seed 3 --workers 4
  python3 tools/tokenizer/check_tokenizer.py models/beam-nano/tokenizer.json "$work/sample/heldout.jsonl" \
    || echo "WARNING: tokenizer cross-check failed"
  python3 tools/reference/check_against_beamline.py --random-nano --skip-beamline
  python3 tools/train/train.py --tokenizer models/beam-nano/tokenizer.json --out "$work/beam-nano" \
    --heldout-out "$work/heldout.jsonl" --seconds "$seconds"
  cp "$work"/beam-nano/{config.json,generation_config.json,harmony.json} "$OUT"/
  split -b 15000000 "$work/beam-nano/model.safetensors" "$OUT/model.safetensors.part-"
  python3 tools/reference/check_against_beamline.py --model "$work/beam-nano" --skip-beamline \
    || echo "WARNING: trained checkpoint torch-vs-numpy check failed"
  python3 tools/train/eval_torch.py --model "$work/beam-nano" --heldout "$work/heldout.jsonl" --json "$OUT/eval.json"
} 2>&1 | tee "$OUT/log.txt"
