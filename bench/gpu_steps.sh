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
