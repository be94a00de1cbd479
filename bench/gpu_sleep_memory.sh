#!/usr/bin/env bash
# vLLM's sleep mode on the GPU (docs/rl.md, issue 20): the device memory (nvidia-smi memory.used) of one
# `beamline serve` before it starts, once loaded, after /sleep?level=1 (vLLM: weights to host memory, KV cache freed),
# after /wake_up, after /sleep?level=2 (weights and KV cache dropped; the weights come back with the next update, here
# /update_weights_from_disk of the same checkpoint), and after /wake_up again; a greedy completion before and after
# each wake must be the same. Passes when each sleep gives back at least 90% of what the server held and the answers
# stay the same.
# Usage: bench/gpu_sleep_memory.sh CARRY_DIR   (CARRY_DIR from bench/make_carry.sh, or a build folder with
#        apps/beamline/beamline; the device call carries it). MODEL (models/beam-nano), OUT (a temporary folder).
#        DEVICE=cpu runs the same sequence on the cpu backend, with the server's resident memory for the GPU's (a dry
#        run of the script itself).
set -uo pipefail
CARRY=${1:?usage: bench/gpu_sleep_memory.sh CARRY_DIR}
MODEL=$(cd "${MODEL:-models/beam-nano}" && pwd)
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
KV=8G  # a KV pool large enough to see it go
[ "$DEVICE" = cuda ] || KV=256M
source bench/open_carry.sh
BIN=$(cd "$CARRY" && pwd)/apps/beamline/beamline
[ -x "$BIN" ] || { echo "gpu_sleep_memory: $BIN is not there" >&2; exit 1; }
[ "$DEVICE" = cuda ] && source bench/cuda_env.sh
source bench/serve_start.sh
server=""

used_mib() {
  if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" | head -1
  elif [ -n "$server" ]; then
    echo $(($(ps -o rss= -p "$server") / 1024))
  else
    echo 0
  fi
}
post() { curl -s -X POST "$base$1" -H 'Content-Type: application/json' -d "${2:-{\}}"; echo; }
answer() {
  curl -s "$base/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "policy", "prompt": [1, 2, 3], "max_tokens": 16, "temperature": 0, "return_token_ids": true}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["token_ids"])'
}

before=$(used_mib)
serve_start "$BIN" "$OUT/serve.log" --model "$MODEL" --device "$DEVICE" --served-model-name policy \
  --speculative-config none --kv-cache-memory "$KV" --weight-update-dir "$(dirname "$MODEL")" || exit 1
first=$(answer)
loaded=$(used_mib)
post "/sleep?level=1" >>"$OUT/control.log"
asleep1=$(used_mib)
post /wake_up >>"$OUT/control.log"
woken1=$(used_mib)
second=$(answer)
post "/sleep?level=2" >>"$OUT/control.log"
asleep2=$(used_mib)
post /update_weights_from_disk "{\"model_path\": \"$MODEL\"}" >>"$OUT/control.log"
post /wake_up >>"$OUT/control.log"
woken2=$(used_mib)
third=$(answer)
kill "$server" 2>/dev/null; wait "$server" 2>/dev/null

held=$((loaded - before))
released() { python3 -c "print(f'{($loaded - $1) / max($held, 1):.0%}')"; }
{
  echo "| state | GPU memory used (MiB) | given back |"
  echo "| --- | --- | --- |"
  echo "| before the server | $before | |"
  echo "| loaded (after one completion) | $loaded | |"
  echo "| /sleep?level=1 | $asleep1 | $(released "$asleep1") |"
  echo "| /wake_up | $woken1 | |"
  echo "| /sleep?level=2 | $asleep2 | $(released "$asleep2") |"
  echo "| /update_weights_from_disk + /wake_up | $woken2 | |"
  echo
  echo "greedy answers: $first / $second / $third"
} | tee "$OUT/sleep.md"
cat "$OUT/control.log"
ok=$(python3 -c "print(int(($loaded - $asleep1) >= 0.9 * $held and ($loaded - $asleep2) >= 0.9 * $held))")
[ "$first" = "$second" ] && [ "$first" = "$third" ] || { echo "the answers changed across sleep"; ok=0; }
[ "$ok" = 1 ] && echo "sleep mode: pass" || echo "sleep mode: FAIL (memory not given back, or answers changed)"
[ "$ok" = 1 ]
