#!/usr/bin/env bash
# One call on the GPU machine: trains beam-nano, writes the checkpoint first, then evaluates it greedily on
# the out-of-distribution turns (tool families and question templates training never saw) and the
# in-distribution held-out turns, and cross-checks it torch-vs-numpy. Leaves under $OUT (at most 8 files, as
# the device tool returns): model.safetensors split into parts below 15 MB (rejoin with
# `cat model.safetensors.part-* > model.safetensors`) and results.tar.gz (config.json, generation_config.json,
# harmony.json, eval-*.json headline figures, eval-*-turns.json.gz completions, log.txt, profile.txt), refreshed after
# every step so that a run cut short still returns what it did.
#   OUT=/some/dir tools/train/gpu_run.sh [training seconds, default 360] [seconds for the whole call, default 560]
# Training ends by 165 s before the end of the call whatever the data and checks took (train.py --stop-by):
# the checkpoint's save and the held-out losses take about 15 s, the two greedy evaluations about 150.
# CONFIG (v3; beam_config.CONFIGS) is the model shape, EXAMPLES (1000000) the training conversations, generated on
# the machine's cores while train.py checks and compiles its fast loss on the GPU, then trains on them as they come
# (--stream-data); EVAL_LIMIT (1000) conversations of each held-out set are decoded (OOD first), EVAL_BATCH (512)
# at a time. TRAIN_ARGS adds train.py options (e.g. --no-compile). PROFILE_STEPS (20; 0: none) training steps are
# profiled (torch.profiler, from step 50) into profile.txt in results.tar.gz.
# Optional: DRAFTER_SECONDS=N trains the speculative-decoding drafter for the new model (train_drafter.py, its
# default generation budget; $OUT/beam-nano-drafter.tar), COMPARE_HELDOUT=file.jsonl also scores the new model on
# another held-out set (v1's), and COMPARE_MODEL=dir scores another model (v1) on the new OOD set, each only
# while time is left.
# INIT_FROM=DIR continues a run: train.py --init-from DIR (a checkpoint folder inside the repository that the call
# carries, as tools/train/carry_checkpoint.py writes it: the v3 checkpoint in BF16 is 59.5 MB and does not fit the
# 64 MiB a call carries together with the tree, its int8 copy (30.2 MB) does). Its config must be CONFIG's; the
# optimizer starts fresh and the learning rate warms up again. Give TRAIN_ARGS="--seed N" another seed than the
# run it continues, or training begins again on the same conversations (the held-out sets then change with it).
# Every step after training is allowed to fail: the checkpoint is already under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
seconds=${1:-360}
budget=${2:-560}
config=${CONFIG:-v3}
examples=${EXAMPLES:-1000000}
eval_limit=${EVAL_LIMIT:-1000}
started=$SECONDS
work=$(mktemp -d /tmp/beam-nano-run.XXXXXX)
small="$work/results"
mkdir -p "$small"
export PYTHONUNBUFFERED=1
tokenizer=${TOKENIZER:-models/beam-nano/tokenizer.json}

left() { echo $((budget - (SECONDS - started))); }
pack() { cp "$work/log.txt" "$small/" 2>/dev/null; tar czf "$OUT/results.tar.gz" -C "$small" . ; }

# eval NAME MODEL HELDOUT LIMIT: greedy eval under what time is left (minus a reserve for the steps after it)
evaluate() {
  local name=$1 model=$2 heldout=$3 limit=$4 reserve=$5
  local allowed=$(( $(left) - reserve ))
  if (( allowed < 20 )); then echo "SKIPPED eval $name: ${allowed}s left"; return; fi
  timeout "$allowed" python3 tools/train/eval_torch.py --model "$model" --heldout "$heldout" --limit "$limit" \
    --batch "${EVAL_BATCH:-512}" --seconds $(( allowed - 10 )) \
    --summary "$small/eval-$name.json" --json "$work/eval-$name-turns.json" || echo "WARNING: eval $name failed or ran out of time"
  [[ -f "$work/eval-$name-turns.json" ]] && gzip -c "$work/eval-$name-turns.json" > "$small/eval-$name-turns.json.gz"
  pack
}

{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  python3 -c "import torch; print('torch', torch.__version__)"
  python3 tools/train/train.py --tokenizer "$tokenizer" --out "$work/beam-nano" \
    --heldout-out "$work/heldout.jsonl" --ood-out "$work/ood.jsonl" --seconds "$seconds" --config "$config" \
    --examples "$examples" --stop-by $(( budget - 165 - (SECONDS - started) )) \
    --stream-data --profile-steps "${PROFILE_STEPS:-20}" --profile-out "$small/profile.txt" \
    ${INIT_FROM:+--init-from "$INIT_FROM"} ${TRAIN_ARGS:-}
  if [[ -f "$work/beam-nano/model.safetensors" ]]; then
    cp "$work"/beam-nano/{config.json,generation_config.json,harmony.json} "$small"/
    split -b 15000000 "$work/beam-nano/model.safetensors" "$OUT/model.safetensors.part-"
    sha256sum "$work/beam-nano/model.safetensors"
  else
    echo "ERROR: no checkpoint written"
  fi
  pack
  echo "after training: $(left) s left"
  evaluate ood "$work/beam-nano" "$work/ood.jsonl" "$eval_limit" 75
  echo "after OOD eval: $(left) s left"
  evaluate heldout "$work/beam-nano" "$work/heldout.jsonl" "$eval_limit" 15
  echo "after held-out eval: $(left) s left"
  if [[ -n "${DRAFTER_SECONDS:-}" ]]; then
    if (( $(left) > DRAFTER_SECONDS + 90 )); then
      timeout $(( $(left) - 20 )) python3 tools/train/train_drafter.py --target "$work/beam-nano" \
        --out "$work/beam-nano-drafter" --seconds "$DRAFTER_SECONDS" --json "$small/drafter-report.json" \
        || echo "WARNING: drafter training failed or ran out of time"
      [[ -f "$work/beam-nano-drafter/model.safetensors" ]] && tar cf "$OUT/beam-nano-drafter.tar" -C "$work" beam-nano-drafter
      pack
    else
      echo "SKIPPED drafter: $(left) s left"
    fi
  fi
  if [[ -n "${COMPARE_HELDOUT:-}" ]]; then evaluate compare-heldout "$work/beam-nano" "$COMPARE_HELDOUT" 600 35; fi
  if [[ -n "${COMPARE_MODEL:-}" ]]; then evaluate compare-model-ood "$COMPARE_MODEL" "$work/ood.jsonl" 600 15; fi
  if (( $(left) > 12 )); then
    timeout $(( $(left) - 5 )) python3 tools/reference/check_against_beamline.py --model "$work/beam-nano" --skip-beamline \
      || echo "WARNING: trained checkpoint torch-vs-numpy check failed or ran out of time"
  fi
  echo "done: $((SECONDS - started)) s"
  pack
} 2>&1 | tee "$work/log.txt"
pack
