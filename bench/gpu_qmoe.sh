#!/usr/bin/env bash
# Branch qmoe's one-token MoE kernels in one GPU call (issues 14 and 21, bench/results/2026-12-03-qmoe.md): the
# weights staged through shared memory (quant/staged_moe.cuh) for FP8, MXFP8, NVFP4 and BF16 experts, against the
# register versions they replace (BEAMLINE_CUDA_TOKEN_MOE=ring: the default before this branch; =legacy: the first
# version), each in a process of its own in the same call. First every version runs against the CPU reference at small
# widths, then each MoE layer (route + experts, CUDA graph) is timed at 1, 4 and 16 tokens
# next to its byte floor (bytes of the router and of every routed expert's weights incl. scales / 4.8 TB/s); last, the
# default version at Beam-1.0's widths against the CPU, in what is left of the budget.
# Usage: bench/gpu_qmoe.sh CARRY_DIR   (CARRY_DIR from `bench/make_carry.sh build CARRY_DIR`); writes $OUT/qmoe.log
#        (every command's whole output) and $OUT/qmoe-perf.md (the perf tables), and exits 1 when a test failed or
#        did not run, or a perf row is missing. At most 300 s once the machine is up.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_qmoe.sh CARRY_DIR}
OUT=${OUT:-$(mktemp -d)}
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/qmoe.log
PERF=$OUT/qmoe-perf.md
STEPS=,all,
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header
cp "$LOG" "$PERF"
problems=()
budget=298
TEST_LINES='FAIL|cases,|T 1 '

echo "=== correctness against the CPU reference, small widths, every version"
harness_tests "staged (default), small: fp8, mxfp8, nvfp4, moe" 20 --small --filter fp8,mxfp8,nvfp4,moe --seed 31
harness_tests "staged (default), small, bfloat16: moe" 15 --small --filter moe --dtype bfloat16 --seed 32
for version in ring legacy; do
  BEAMLINE_CUDA_TOKEN_MOE=$version harness_tests "$version, small: fp8, mxfp8, nvfp4, moe" 20 --small \
    --filter fp8,mxfp8,nvfp4,moe --seed 33
done

echo "=== MoE layer (route + experts, CUDA graph) at 1, 4, 16 tokens, each next to its floor"
quant_rows='^\| 1 \|;^\| 4 \|;^\| 16 \|'
micro_rows='^\| mxfp8 \| 1 \|;^\| mxfp8 \| 4 \|;^\| mxfp8 \| 16 \|;^\| nvfp4 \| 1 \|;^\| nvfp4 \| 4 \|;^\| nvfp4 \| 16 \|'
bf16_rows='^\| bfloat16 \| 1 \|;^\| bfloat16 \| 4 \|;^\| bfloat16 \| 16 \|'
for version in staged ring legacy; do
  tokens=1,4,16
  [ $version = staged ] || tokens=1  # FP8 and BF16 take the same kernels from 2 tokens on under every version
  rows() { [ $version = staged ] && echo "$1" || echo "${1%%;*}"; }
  export BEAMLINE_CUDA_TOKEN_MOE=$([ $version = staged ] || echo $version)
  harness_perf "FP8 block-128 ($version)" 20 "$(rows "$quant_rows")" fp8 --no-linear --tokens $tokens --iterations 50
  # MXFP8 and NVFP4 take the staged kernels at every token count: ring re-times the streaming kernels at 4 and 16.
  if [ $version = legacy ]; then
    harness_perf "MXFP8 and NVFP4 ($version)" 15 '^\| mxfp8 \| 1 \|;^\| nvfp4 \| 1 \|' micro --tokens 1 --iterations 50
  else
    harness_perf "MXFP8 and NVFP4 ($version)" 30 "$micro_rows" micro --tokens 1,4,16 --iterations 50
  fi
  harness_perf "BF16 ($version)" 20 "$(rows "$bf16_rows")" moe --dtype bfloat16 --tokens $tokens --iterations 50
done
unset BEAMLINE_CUDA_TOKEN_MOE

echo "=== correctness against the CPU reference at Beam-1.0's widths (one token of each format), with what is left"
harness_tests "staged (default), full widths: fp8, mxfp8, nvfp4" 90 --filter fp8,mxfp8,nvfp4 --seed 34
harness_tests "staged (default), full widths: moe (BF16 experts)" 60 --filter moe --seed 35
rm -f "$OUT/step.txt"

cat <<'EOF' | tee -a "$PERF"

=== before this branch (H200, 2026-12-03, bench/results/2026-12-03-session8-final.md; the `ring` rows above re-measure it)
FP8 1 token 0.1269 ms (floor 0.0666; goal <= 0.085 ms all-in); 16 tokens 0.9609 (floor 0.8041).
MXFP8 1 token 0.1616 ms (1.27x FP8; goal within 5% of FP8); NVFP4 1 token 0.1339 ms (3.53x its floor 0.0380; goal 1.20x).
MXFP8 / NVFP4 16 tokens 2.5994 / 2.2870 ms (3.14x / 4.81x their floors): each token streamed its experts on the
  CUDA cores (the staged kernels read them per token too, at their bandwidth: ~1.3x the floor's bytes at 16 tokens).
BF16 1 token 0.197 ms all-in (2026-12-01; goal <= 0.150 ms, routing included).
EOF
if [ ${#problems[@]} -gt 0 ]; then
  printf 'PROBLEM: %s\n' "${problems[@]}"
  exit 1
fi
echo "all tests passed and every perf row came out"
