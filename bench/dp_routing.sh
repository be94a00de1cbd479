#!/usr/bin/env bash
# Data-parallel routing on beam-nano (CPU): the same multi-turn replay (each turn resends the growing conversation)
# against `serve --data-parallel-size 2` with --data-parallel-routing prefix-aware and least-loaded; prints each run's
# prefix-cache hit rate, prompt tokens computed, duration and throughput from `beamline bench serve`'s summary.
# Usage: bench/dp_routing.sh BEAMLINE_EXE OUT_DIR [SESSIONS (24)] [TURNS (4)] [CONCURRENCY (8)]
set -euo pipefail
exe=$(realpath "${1:?usage: dp_routing.sh BEAMLINE_EXE OUT_DIR [SESSIONS] [TURNS] [CONCURRENCY]}")
out=$(realpath -m "${2:?OUT_DIR}")
sessions=${3:-24} turns=${4:-4} concurrency=${5:-8}
cd "$(dirname "$0")/.."
mkdir -p "$out"
for routing in prefix-aware least-loaded; do
  "$exe" serve --model models/beam-nano --device cpu --port 0 --data-parallel-size 2 \
    --data-parallel-routing "$routing" --speculative-config none > "$out/serve-$routing.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  port=""
  for _ in $(seq 1200); do
    port=$(sed -n 's|.*at http://[^:]*:\([0-9]*\)/v1.*|\1|p' "$out/serve-$routing.log" | head -1)
    [ -n "$port" ] && break
    kill -0 $server 2>/dev/null || { cat "$out/serve-$routing.log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$out/serve-$routing.log" >&2; exit 1; }
  "$exe" bench serve --base-url "http://127.0.0.1:$port" --backend openai-chat --dataset-name multi-turn \
    --num-sessions "$sessions" --num-turns "$turns" --random-input-len 64 --random-output-len 32 \
    --max-concurrency "$concurrency" --request-rate inf --seed 1 --save-result --result-dir "$out" \
    --result-filename "bench-$routing.json" > "$out/bench-$routing.log" 2>&1
  kill $server; wait $server 2>/dev/null || true
  echo "== $routing"
  grep -i -E "prefix|duration|throughput|prompt tokens|successful" "$out/bench-$routing.log"
done
