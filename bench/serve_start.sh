# Sourced by the bench scripts that run one `beamline serve` on this machine (serve_many_clients.sh, soak.sh,
# gpu_serve_sweep.sh): starts it on a free port, waits for the address it prints, and stops it, with every other
# background job of the calling script, when that script exits.
#   serve_start EXE LOG [serve flags...]   sets $server (its pid) and $base (http://127.0.0.1:PORT); fails with the
#                                          log when the server exits or prints no address within 90 s
#                                          (SERVE_START_SECONDS: another limit, for models that take longer to load)
#   metric NAME                            a /metrics value, with or without labels (vllm:* carry model_name)

serve_start() {
  local exe=$1 log=$2 port=""
  shift 2
  "$exe" serve --port 0 "$@" > "$log" 2>&1 &
  server=$!
  trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  for _ in $(seq $((${SERVE_START_SECONDS:-90} * 10))); do
    port=$(sed -n 's|.*at http://[^:]*:\([0-9]*\)/v1.*|\1|p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "beamline serve did not start (log: $log):" >&2; cat "$log" >&2; return 1; }
  base=http://127.0.0.1:$port
}

metric() {
  curl -s "$base/metrics" | awk -v name="$1" '$1 == name || index($1, name "{") == 1 {print $2; exit}'
}
