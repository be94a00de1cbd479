#!/usr/bin/env bash
# Issue 22's mixed soak on this machine: `beamline serve` with the default model on the CPU, over loopback, under a
# steady mix of chat, completions, streaming, tool calls, n > 1 and clients hanging up mid-request for SECONDS, with
# resident memory sampled each minute and /health probed every 5 s (bench/soak_client.py). Fails unless no request
# failed, every request the engine finished is accounted for, vllm:kv_cache_usage_perc is back to 0 and RSS after
# warm-up stays flat within 5%. Prints a Markdown summary; it, the per-minute samples, the probes, any failures and
# the server log go to OUT_DIR.
# The KV pool defaults to 64 MiB (SOAK_KV_CACHE_MEMORY), not the CPU's 3.6 GiB: the prefix cache keeps freed blocks
# and hands out untouched ones first, so a large pool's pages become resident one by one for as long as new prompts
# arrive, a growth that would hide a leak of the same size; a small pool is all resident within the warm-up.
# Usage: bench/soak.sh BEAMLINE_EXE OUT_DIR [SECONDS (1800)] [CONCURRENCY (8)] [serve flags...]
#   warm-up: SOAK_WARMUP seconds (default a tenth of SECONDS, at least 60)
set -euo pipefail
exe=$(realpath "${1:?usage: soak.sh BEAMLINE_EXE OUT_DIR [SECONDS] [CONCURRENCY] [serve flags...]}")
out=$(realpath -m "${2:?OUT_DIR}")
seconds=${3:-1800}
concurrency=${4:-8}
shift 4 2>/dev/null || shift $#
warmup=${SOAK_WARMUP:-$(( seconds / 10 > 60 ? seconds / 10 : 60 ))}
cd "$(dirname "$0")/.."
mkdir -p "$out"

source bench/serve_start.sh
serve_start "$exe" "$out/serve.log" --model models/beam-nano --device cpu \
  --kv-cache-memory "${SOAK_KV_CACHE_MEMORY:-64MiB}" "$@"
echo "$exe (pid $server, $base), scripts at commit $(git rev-parse --short HEAD): $seconds s at $concurrency workers"
status=0
/usr/bin/python3 bench/soak_client.py --base-url "$base" --pid "$server" --duration "$seconds" --warmup "$warmup" \
  --concurrency "$concurrency" --out "$out" || status=$?
kill -0 "$server" 2>/dev/null || { echo "beamline serve is gone (log: $out/serve.log)" >&2; status=1; }
exit $status
