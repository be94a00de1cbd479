#!/usr/bin/env bash
# Session 9's last H200 call (throwaway, not committed): every step in priority order under one budget; each step's
# output under $OUT/w/<step>/, packed into $OUT/all.tar.gz after every step so a cut call still returns what ran.
set -u
O=$OUT; start=$SECONDS; budget=${BUDGET:-420}
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
  tail -4 "$O/w/$name/stdout.txt" | tee -a "$O/w/summary.txt"
  pack
}
CARRY=.carry; source bench/open_carry.sh
BIN=$PWD/.carry/apps/beamline/beamline
export LD_LIBRARY_PATH="$PWD/.carry/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; cat .carry/apps/beamline/COMMIT; } \
  | tee "$O/w/machine.txt"
W=$(mktemp -d)
"$BIN" make-model --preset small --out "$W/small" --seed 7 >/dev/null 2>&1
"$BIN" make-model --preset beam-1.0 --layers 8 --no-weights --out "$W/beam8" >/dev/null 2>&1

step ctest 150 env BEAMLINE_REQUIRE_CUDA=1 JOBS=12 bash bench/gpu_ctest.sh .carry
step serve_check 80 python3 bench/serve_check.py "$BIN" "$W/small" cuda --bfloat16-model models/beam-nano
step spec_b1 70 python3 bench/dflash_throughput.py "$BIN" --model models/beam-nano --drafter models/beam-nano-drafter \
  --decode 256 --phases --batches 1 --rounds 8
step decode_step 60 python3 bench/serve_throughput.py "$BIN" "$W/beam8" --batches 1,16 --prompt 8192 --decode 64 \
  --floor-bytes 8292925440
qmoe() {
  local ops=.carry/tests/backend_ops/backend_ops
  unset BEAMLINE_CUDA_TOKEN_MOE
  $ops test --device cuda --small --filter fp8,mxfp8,nvfp4,moe --seed 31 2>&1 | grep -E "cases,|\| fail" | head -8
  $ops test --device cuda --small --filter moe --dtype bfloat16 --seed 32 2>&1 | grep -E "cases,|\| fail" | head -8
  for v in staged ring; do
    echo "### $v"
    if [ $v = staged ]; then unset BEAMLINE_CUDA_TOKEN_MOE; else export BEAMLINE_CUDA_TOKEN_MOE=$v; fi
    $ops perf fp8 --no-linear --tokens 1,16 --iterations 50 2>&1 | grep -E "^\|"
    $ops perf micro --tokens 1,16 --iterations 50 2>&1 | grep -E "^\|"
    $ops perf moe --dtype bfloat16 --tokens 1,16 --iterations 50 2>&1 | grep -E "^\|"
  done
}
export -f qmoe
step qmoe 80 bash -c qmoe
fp8kv() {
  for v in default legacy keys-cvt query-rows query-rows-bulk; do
    echo "### $v"
    if [ $v = default ]; then unset BEAMLINE_CUDA_DECODE_ATTENTION; else export BEAMLINE_CUDA_DECODE_ATTENTION=$v; fi
    .carry/tests/backend_ops/backend_ops test --device cuda --filter kv_decode 2>&1 | grep -E "cases,|\| fail" | head -5
    .carry/tests/backend_ops/backend_ops perf attention --kv-cache-dtype fp8 --filter "decode global" --graph 2>&1 \
      | grep -E "^\| decode"
  done
  unset BEAMLINE_CUDA_DECODE_ATTENTION
  echo "### bfloat16 pool, default"
  .carry/tests/backend_ops/backend_ops perf attention --kv-cache-dtype bfloat16 --filter "decode global" --graph 2>&1 \
    | grep -E "^\| decode"
}
export -f fp8kv
step fp8kv 90 bash -c fp8kv
step spec_b16 60 python3 bench/dflash_throughput.py "$BIN" --model models/beam-nano --drafter models/beam-nano-drafter \
  --decode 256 --phases --batches 16,64 --rounds 2
step lora 70 python3 bench/lora_serve_throughput.py "$BIN" --device cuda
echo "done in $(( SECONDS - start )) s" | tee -a "$O/w/summary.txt"
pack
