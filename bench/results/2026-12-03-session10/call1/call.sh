#!/usr/bin/env bash
# Session 10's H200 call 1 (a throwaway driver, kept as the record of what ran): bench/device_steps.sh's steps in
# priority order under one budget (BUDGET, seconds).
CARRY=.carry source bench/device_steps.sh

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
finish
