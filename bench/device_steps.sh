#!/usr/bin/env bash
# Sourced by a device call's driver: the call's work as steps in priority order under one time budget, so that a call
# cut short still returns what ran. Each step's output goes under $OUT/w/<step>/ and the whole of $OUT/w is packed
# into $OUT/all.tar.gz after every step (the device returns a few files only: one archive holds them all).
# Usage (the driver, run on the GPU machine from the repository root):
#   BUDGET=560 bash driver.sh     where driver.sh does  CARRY=.carry source bench/device_steps.sh
#                                                      step NAME LIMIT_S COMMAND...   (as many as fit)
#                                                      finish
# Sets BIN (the carry's beamline) and LD_LIBRARY_PATH; writes $OUT/w/machine.txt (date, GPU, commit) and
# $OUT/w/summary.txt (each step's exit status, seconds and last lines; "NOT RUN" for a step the budget left out).
set -u
O=$OUT
device_steps_start=$SECONDS
device_steps_budget=${BUDGET:-560}
mkdir -p "$O/w"
left() { echo $(( device_steps_budget - (SECONDS - device_steps_start) )); }
pack() { tar czf "$O/all.tar.gz" -C "$O/w" . 2>/dev/null; }
step() {  # NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  if (( l < 20 )); then echo "NOT RUN $name: ${l} s left" | tee -a "$O/w/summary.txt"; return; fi
  (( limit > l - 5 )) && limit=$(( l - 5 ))
  local t0=$SECONDS
  mkdir -p "$O/w/$name"
  OUT="$O/w/$name" timeout "$limit" "$@" >"$O/w/$name/stdout.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc in $(( SECONDS - t0 )) s (limit $limit)" | tee -a "$O/w/summary.txt"
  tail -6 "$O/w/$name/stdout.txt" | tee -a "$O/w/summary.txt"
  pack
}
finish() {
  echo "done in $(( SECONDS - device_steps_start )) s" | tee -a "$O/w/summary.txt"
  pack
}
source bench/open_carry.sh
BIN=$PWD/$CARRY/apps/beamline/beamline
export BIN LD_LIBRARY_PATH="$PWD/$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader; cat "$CARRY/apps/beamline/COMMIT"; } |
  tee "$O/w/machine.txt"
