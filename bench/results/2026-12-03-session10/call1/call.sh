#!/usr/bin/env bash
# Session 10, H200 call 1 (throwaway driver, a copy goes to bench/results): steps in priority order under one budget,
# each step's output under $OUT/w/<step>/, packed into $OUT/all.tar.gz after each step.
set -u
O=$OUT; start=$SECONDS; budget=${BUDGET:-560}
mkdir -p "$O/w"
left() { echo $(( budget - (SECONDS - start) )); }
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
CARRY=.carry; source bench/open_carry.sh
BIN=$PWD/.carry/apps/beamline/beamline
export LD_LIBRARY_PATH="$PWD/.carry/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader; cat .carry/apps/beamline/COMMIT; } \
  | tee "$O/w/machine.txt"

step ctest 170 env BEAMLINE_REQUIRE_CUDA=1 JOBS=12 bash bench/gpu_ctest.sh .carry
peer_mps() {
  local mps; mps=$(command -v nvidia-cuda-mps-control || ls /usr/bin/nvidia-cuda-mps-control /usr/local/cuda/bin/nvidia-cuda-mps-control 2>/dev/null | head -1)
  echo "mps control: ${mps:-none}"
  echo "### without MPS"
  BEAMLINE_REQUIRE_CUDA=1 timeout 25 .carry/tests/test_peer_all_reduce 2>&1 | tail -5
  [ -n "$mps" ] || return 3
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps-pipe /tmp/mps-log
  "$mps" -d; sleep 1
  echo "### under MPS"
  BEAMLINE_REQUIRE_CUDA=1 timeout 25 .carry/tests/test_peer_all_reduce 2>&1 | tail -12
  local rc=${PIPESTATUS[0]}
  echo quit | "$mps"; sleep 1
  cat /tmp/mps-log/control.log 2>/dev/null | tail -5
  return "$rc"
}
export -f peer_mps
step peer_mps 60 bash -c peer_mps
step rollout 100 env ROUNDS=5 bash bench/gpu_rollout.sh .carry
step rollout_mxfp8 80 env ROUNDS=3 REPLAY_QUANTIZATION=mxfp8 bash bench/gpu_rollout.sh .carry
step completions 260 bash bench/gpu_batch_invariant.sh .carry completions
echo "done in $(( SECONDS - start )) s" | tee -a "$O/w/summary.txt"
pack
