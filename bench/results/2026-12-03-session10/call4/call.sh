#!/usr/bin/env bash
# Session 10's H200 call 4 (a throwaway driver, kept as the record of what ran): bench/device_steps.sh's steps in
# priority order under one budget (BUDGET, seconds).
CARRY=.carry source bench/device_steps.sh
step ctest 150 env BEAMLINE_REQUIRE_CUDA=1 JOBS=12 bash bench/gpu_ctest.sh .carry
step spec 170 env SETS=new bash bench/gpu_specblock.sh .carry
tp8() { QUANTIZATION=fp8 SPLITS=tp8 bash bench/tp8_rank_step.sh "$BIN" 1; }
export -f tp8
step tp8_fp8 300 bash -c tp8
finish
