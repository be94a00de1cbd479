#!/usr/bin/env bash
# Branch fp8dec's decode-path kernels in one GPU call (issue 14's speed goals, bench/results/2026-12-03-fp8dec.md):
# the decode attention's per-tile copies (FP8 and BF16 pools) and V in registers (FP8), and the one-token MoE's
# register ring, PDL down pass and gate|up blocks of 4 warps (FP8, MXFP8) and NVFP4 on the tensor cores. Each new
# kernel runs against the CPU reference first, then is timed next to the kernel it replaces
# (BEAMLINE_CUDA_DECODE_ATTENTION=legacy, BEAMLINE_CUDA_TOKEN_MOE=legacy: the previous kernels, in separate processes
# of the same call), every row next to its floor; the figures measured before this branch are printed beside them
# (bench/results/2026-12-02-quant3-decode.md, run 1 and run 2).
# Usage: bench/gpu_fp8dec.sh CARRY_DIR   (CARRY_DIR from `bench/make_carry.sh --tests build CARRY_DIR`); writes
#        $OUT/fp8dec.log (every command's whole output) and exits 1 when a test failed or did not run, or a perf row
#        is missing. At most 150 s once the machine is up (each step's limit is cut to what is left of that).
set -uo pipefail
CARRY=${1:?usage: bench/gpu_fp8dec.sh CARRY_DIR}
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/fp8dec.log
STEPS=,all,
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header
problems=()
# The whole script stays within 150 s: each step gets its own limit or what is left of the budget, whichever is less.
budget=148

TEST_LINES='FAIL|cases,|fp8 kv decode (tile edges|1 row 8K|bs 4)|one token'

echo "=== correctness, new kernels (default) against the CPU reference"
harness_tests "attention" 45 --small --filter attention --seed 21
harness_tests "fp8, mxfp8, nvfp4" 25 --small --filter fp8,mxfp8,nvfp4 --seed 22
echo "=== correctness, legacy kernels (what BEAMLINE_CUDA_*=legacy still selects)"
BEAMLINE_CUDA_TOKEN_MOE=legacy BEAMLINE_CUDA_DECODE_ATTENTION=legacy \
  harness_tests "legacy fp8, mxfp8, nvfp4" 15 --small --filter fp8,mxfp8,nvfp4 --seed 23

echo "=== correctness, decode attention versions keys-cvt (K by cvt, not the default) and legacy, and the default"
# test_paged_attention's FP8 cases (decode rows of 300 keys at head_dim 128: interior tiles) on both backends.
tests_dir=$(mktemp -d)
export LD_LIBRARY_PATH="$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if tar -xJf "$CARRY/tests.tar.xz" -C "$tests_dir" tests/test_paged_attention 2>>"$LOG"; then
  for version in keys-cvt legacy default; do
    limit=$(limit_of 12)
    if [ "$limit" -le 0 ]; then problems+=("test_paged_attention ($version): not run (budget)"); continue; fi
    BEAMLINE_CUDA_DECODE_ATTENTION=$([ $version = default ] || echo $version) \
      step "$limit" 'FAILED|PASSED|tests? ran' "$tests_dir/tests/test_paged_attention" --gtest_filter='*Fp8*'
    grep -q '\[  PASSED  \]' "$OUT/step.txt" && ! grep -q '\[  FAILED  \]' "$OUT/step.txt" ||
      problems+=("test_paged_attention ($version): failed or did not run")
  done
else
  problems+=("test_paged_attention: not in $CARRY/tests.tar.xz (make the carry with --tests)")
fi

# In order of the goals: FP8 decode attention, the one-token MoE of each format, then BF16 decode (no regression).
attention_rows='decode global B=1 L=128K;decode global B=32 L=8K'
attention_perf() {  # label, pool dtype (the version comes from BEAMLINE_CUDA_DECODE_ATTENTION)
  harness_perf "decode attention, $2 pool, $1" 12 "$attention_rows" attention --kv-cache-dtype "$2" --filter "decode global"
}
BEAMLINE_CUDA_DECODE_ATTENTION=per-tile attention_perf "per-tile copies, V in registers (new)" fp8
BEAMLINE_CUDA_DECODE_ATTENTION=legacy attention_perf "per-row copies (legacy)" fp8
BEAMLINE_CUDA_DECODE_ATTENTION=keys-cvt attention_perf "per-tile copies, V in registers, K by cvt (keys-cvt)" fp8
fp8_rows='^\| 1 \|;^\| 16 \|;^\| 64 \|'
harness_perf "FP8 MoE layer (new)" 20 "$fp8_rows" fp8 --no-linear --tokens 1,16,64 --iterations 20
BEAMLINE_CUDA_TOKEN_MOE=legacy harness_perf "FP8 MoE layer (legacy)" 15 '^\| 1 \|' fp8 --no-linear --tokens 1 --iterations 20
micro_rows='^\| mxfp8 \| 1 \|;^\| nvfp4 \| 1 \|'
harness_perf "MXFP8 and NVFP4 MoE layer (new)" 25 "$micro_rows;^\| mxfp8 \| 64 \|;^\| nvfp4 \| 64 \|" micro --tokens 1,16,64 --iterations 20
BEAMLINE_CUDA_TOKEN_MOE=legacy harness_perf "MXFP8 and NVFP4 MoE layer (legacy)" 15 "$micro_rows" \
  micro --tokens 1 --iterations 20
attention_perf "per-tile copies (new)" bfloat16
BEAMLINE_CUDA_DECODE_ATTENTION=legacy attention_perf "per-row copies (legacy)" bfloat16
rm -f "$OUT/step.txt"

cat <<'EOF'

=== before this branch (H200, 2026-12-02, bench/results/2026-12-02-quant3-decode.md)
FP8 KV decode B=1 L=128K: 0.1086 ms, 51% of floor (run 1); 0.0962 ms, 58% (run 2, the kernel main has: compare
  with the legacy rows above); B=32 L=8K: 0.2065 ms, 54% (run 1); 0.1829 ms, 61% (run 2). Goal >= 85%.
BF16 decode B=1 L=128K 0.1330 ms, 84%; B=32 L=8K 0.2551 ms, 88%.
FP8 MoE 1 token (route + experts): 0.1335 ms, floor 0.0666 (goal <= 0.085 ms); 64 tokens 2.0804 ms (floor 1.8202).
MXFP8 1 token 0.1924 ms, floor 0.0687 (goal within 5% of FP8); NVFP4 1 token 0.1618 ms, floor 0.0380
  (goal <= 1.20x, 0.0456 ms; the CUDA-core streaming kernels then, which BEAMLINE_CUDA_TOKEN_MOE=legacy still runs).
EOF
if [ ${#problems[@]} -gt 0 ]; then
  printf 'PROBLEM: %s\n' "${problems[@]}"
  exit 1
fi
echo "all tests passed and every perf row came out"
