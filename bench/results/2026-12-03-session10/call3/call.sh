#!/usr/bin/env bash
# Session 10, H200 call 3 (throwaway driver, a copy goes to bench/results): steps in priority order under one budget,
# each step's output under $OUT/w/<step>/, packed into $OUT/all.tar.gz after each step.
set -u
O=$OUT; start=$SECONDS; budget=${BUDGET:-565}
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
step spec 230 env SETS="new nohold" bash bench/gpu_specblock.sh .carry
step tune14 120 bash bench/gpu_tune14.sh .carry
step rollout 70 env ROUNDS=3 bash bench/gpu_rollout.sh .carry
step routed_cost 60 python3 bench/routed_experts_cost.py "$BIN" --device cuda --batch 64 --prompt 128 --decode 128 --rounds 6
tp8() {
  QUANTIZATION=fp8 SPLITS=tp8,ep8-k1 bash bench/tp8_rank_step.sh "$BIN" 1,16,64
  SPLITS=tp8 bash bench/tp8_rank_step.sh "$BIN" 1,16,64
}
export -f tp8
export BIN
step tp8 120 bash -c tp8
echo "done in $(( SECONDS - start )) s" | tee -a "$O/w/summary.txt"
pack
