#!/usr/bin/env bash
# Thousands of concurrent streaming clients against one `beamline serve` on this machine (issue 22's load check):
# starts the server, samples its open descriptors and threads and probes /health while `beamline bench serve`
# holds CLIENTS streams at once, then checks that every request was answered, nothing is left running or waiting,
# every KV block is free, and descriptors and threads fall back once the connections are gone. With LEAVE_FRACTION
# set (e.g. 0.2), bench/leaving_clients.py is the client instead: that fraction of the streams leave at random points.
# Prints a Markdown summary; the bench JSON, the samples and the logs go to OUT_DIR.
# Usage: [LEAVE_FRACTION=F] bench/serve_many_clients.sh BEAMLINE_EXE OUT_DIR [CLIENTS (4096)] [serve flags...]
set -euo pipefail
exe=$(realpath "${1:?usage: serve_many_clients.sh BEAMLINE_EXE OUT_DIR [CLIENTS] [serve flags...]}")
out=$(realpath -m "${2:?OUT_DIR}")
clients=${3:-4096}
shift 3 2>/dev/null || shift $#
cd "$(dirname "$0")/.."
mkdir -p "$out"
python=/usr/bin/python3

source bench/serve_start.sh
serve_start "$exe" "$out/serve.log" --model models/beam-nano --device cpu "$@"
resources() { echo "$(ls /proc/$server/fd | wc -l) $(awk '/^Threads:/ {print $2}' /proc/$server/status)"; }
read -r fds_idle threads_idle <<< "$(resources)"

# Samples every half second: time, descriptors, threads; /health probes: HTTP code and seconds.
(while kill -0 $server 2>/dev/null; do echo "$(date +%s.%N) $(resources)"; sleep 0.5; done) > "$out/resources.txt" &
sampler=$!
(while [ ! -e "$out/.done" ]; do
   curl -s -o /dev/null --max-time 120 -w '%{http_code} %{time_total}\n' "$base/health" || echo "000 120"
   sleep 0.2
 done) > "$out/health.txt" &
prober=$!

start=$(date +%s.%N)
if [ -n "${LEAVE_FRACTION:-}" ]; then
  $python bench/leaving_clients.py "$base" "$clients" "$LEAVE_FRACTION" 16 22 "$out/bench.json" > "$out/bench.log" 2>&1
else
  "$exe" bench serve --base-url "$base" --backend openai --dataset-name random --random-input-len 32 \
    --random-output-len 16 --ignore-eos --num-prompts "$clients" --max-concurrency "$clients" --request-rate inf \
    --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,99 --save-result --result-dir "$out" \
    --result-filename bench.json > "$out/bench.log" 2>&1
fi
touch "$out/.done"
wait $prober
wall=$($python -c "import time; print(f'{time.time() - $start:.1f}')")

running=$(metric vllm:num_requests_running); waiting=$(metric vllm:num_requests_waiting)
kv=$(metric vllm:kv_cache_usage_perc); streams=$(metric beamline:http_streams_active)
sleep 14  # past the keep-alive timeout (5 s; 10 s for the thread-per-connection server's idle threads)
read -r fds_after threads_after <<< "$(resources)"
kill $sampler 2>/dev/null || true

$python - "$out" "$clients" "$wall" "$fds_idle" "$threads_idle" "$fds_after" "$threads_after" \
  "$running" "$waiting" "$kv" "$streams" <<'PY'
import json, sys
out, clients, wall, fds_idle, threads_idle, fds_after, threads_after, running, waiting, kv, streams = sys.argv[1:]
bench = json.load(open(f"{out}/bench.json"))
samples = [line.split() for line in open(f"{out}/resources.txt") if len(line.split()) == 3]
health = [line.split() for line in open(f"{out}/health.txt") if line.strip()]
times = sorted(float(t) * 1000 for _, t in health)
bad = sum(code != "200" for code, _ in health)
pct = lambda p: times[min(len(times) - 1, int(p * len(times)))] if times else float("nan")
print(f"| clients | {clients} |")
print(f"| completed / failed | {bench['completed']} / {bench['failed']} |")
if "left" in bench:
    print(f"| left at random points (planned) | {bench['left']} ({bench['planned_to_leave']}) |")
print(f"| max concurrent requests (client) | {bench['max_concurrent_requests']} |")
print(f"| wall (s) | {wall} |")
print(f"| output tok/s | {bench['output_throughput']:.1f} |")
print(f"| TTFT p50 / p99 (ms) | {bench['median_ttft_ms']:.0f} / {bench['p99_ttft_ms']:.0f} |")
print(f"| E2EL p50 / p99 (ms) | {bench['median_e2el_ms']:.0f} / {bench['p99_e2el_ms']:.0f} |")
print(f"| server descriptors idle / peak / after | {fds_idle} / {max(int(s[1]) for s in samples)} / {fds_after} |")
print(f"| server threads idle / peak / after | {threads_idle} / {max(int(s[2]) for s in samples)} / {threads_after} |")
print(f"| /health probes, not 200, over 100 ms | {len(times)}, {bad}, {sum(t > 100 for t in times)} |")
print(f"| /health p50 / p95 / max (ms) | {pct(0.5):.1f} / {pct(0.95):.1f} / {times[-1] if times else float('nan'):.1f} |")
print(f"| after: running / waiting / KV usage / open streams | {running} / {waiting} / {kv} / {streams} |")
PY
