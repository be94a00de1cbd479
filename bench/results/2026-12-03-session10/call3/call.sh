#!/usr/bin/env bash
# Session 10's H200 call 3 (a throwaway driver, kept as the record of what ran): bench/device_steps.sh's steps in
# priority order under one budget (BUDGET, seconds).
CARRY=.carry source bench/device_steps.sh
step ctest 170 env BEAMLINE_REQUIRE_CUDA=1 JOBS=12 bash bench/gpu_ctest.sh .carry
step spec 230 env SETS="new nohold" bash bench/gpu_specblock.sh .carry
step tune14 120 bash bench/gpu_tune14.sh .carry
step rollout 70 env ROUNDS=3 bash bench/gpu_rollout.sh .carry
step routed_cost 60 python3 bench/routed_experts_cost.py "$BIN" --device cuda --batch 64 --prompt 128 --decode 128 --rounds 6
tp8() {
  QUANTIZATION=fp8 SPLITS=tp8,ep8-k1 bash bench/tp8_rank_step.sh "$BIN" 1,16,64
  SPLITS=tp8 bash bench/tp8_rank_step.sh "$BIN" 1,16,64
}
export -f tp8
step tp8 120 bash -c tp8
finish
