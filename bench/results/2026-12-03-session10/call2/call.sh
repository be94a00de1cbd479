#!/usr/bin/env bash
# Session 10's H200 call 2 (a throwaway driver, kept as the record of what ran): bench/device_steps.sh's steps in
# priority order under one budget (BUDGET, seconds).
CARRY=.carry source bench/device_steps.sh

step gpu_check 345 bash bench/gpu_check.sh .carry
perf() { BUDGET=$(( $1 - 15 )) bash bench/gpu_perf.sh .carry; }
export -f perf
l=$(left); step gpu_perf $(( l - 3 )) bash -c "perf $(( l - 8 ))"
finish
