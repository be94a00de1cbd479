# Sourced by the GPU scripts that run a list of named steps, with LOG, OUT and STEPS (",a,b,") set (CARRY too for
# log_header).
# step runs a command with a time limit, its whole output to the log; it prints the lines matching the pattern and the
# exit status, so one device call's reply shows what matters while the log keeps everything.
step() {  # seconds, pattern, command...
  local limit=$1 pattern=$2 start=$SECONDS
  shift 2
  echo "\$ $*" >>"$LOG"
  timeout "$limit" "$@" >"$OUT/step.txt" 2>&1
  local status=$?
  cat "$OUT/step.txt" >>"$LOG"
  echo "\$ ${*:1:6}... exit $status in $((SECONDS - start)) s"
  grep -E "$pattern" "$OUT/step.txt" | tail -60
}
wanted() { [[ $STEPS == *",$1,"* ]]; }
# Seconds granted to a step that asks for $1 within the script's whole `budget` (seconds since the script started): the
# request, or what is left of the budget when that is less (0: nothing left).
limit_of() {
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$1" ]; then echo $((left > 0 ? left : 0)); else echo "$1"; fi
}
# Starts the log with the date, the carry's commit (or the build folder's) and the GPU with its clocks (or the CPU
# cores), and prints them.
log_header() {
  {
    date -u '+%Y-%m-%d %H:%M UTC'
    if [ -s "$CARRY/apps/beamline/COMMIT" ]; then
      echo "commit $(tr '\n' ' ' <"$CARRY/apps/beamline/COMMIT")"
    else
      echo "binary of the build folder $CARRY; scripts at $(git rev-parse --short HEAD)"
    fi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null ||
      echo "$(nproc) CPU cores"
  } | tee "$LOG"
}
# The op harness ($OPS) under the script's `budget`, each failure added to `problems`. harness_tests LABEL SECONDS
# ARGS...: passes when the harness prints "N cases, 0 failed" with N > 0 within its limit; TEST_LINES (a regex) picks
# the lines shown besides the counts.
harness_tests() {
  local label=$1 limit
  limit=$(limit_of "$2")
  shift 2
  echo "--- tests: $label"
  if [ "$limit" -le 0 ]; then problems+=("$label: not run (the budget was spent)"); return; fi
  step "$limit" "${TEST_LINES:-FAIL|cases,}" "$OPS" test "$@"
  grep -qE '^[1-9][0-9]* cases, 0 failed$' "$OUT/step.txt" || problems+=("$label: failed or did not run")
}
# harness_perf LABEL SECONDS ROWS ARGS...: passes when every expected row came out (ROWS: regexes separated by ;);
# with PERF set, the table also goes there under the label.
harness_perf() {
  local label=$1 limit rows=$3
  limit=$(limit_of "$2")
  shift 3
  echo "--- $label"
  [ -z "${PERF:-}" ] || printf '\n### %s\n' "$label" >>"$PERF"
  if [ "$limit" -le 0 ]; then problems+=("$label: not run (the budget was spent)"); return; fi
  step "$limit" '^\| ' "$OPS" perf "$@"
  [ -z "${PERF:-}" ] || grep -E '^\| ' "$OUT/step.txt" >>"$PERF"
  local row
  local -a expected
  IFS=';' read -ra expected <<<"$rows"
  for row in "${expected[@]}"; do
    grep -qE "$row" "$OUT/step.txt" || problems+=("$label: no row '$row'")
  done
}
