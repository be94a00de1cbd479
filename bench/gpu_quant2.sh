#!/usr/bin/env bash
# Issue 14's leftovers in one GPU call (branch quant2): the FP8 KV cache on the CUDA backend (the op harness's
# attention cases, test_paged_attention, `generate` on beam-nano against the CPU and against BF16, the KV capacity
# that `serve` logs), FP8 projections on cuBLASLt's block-scaled matmul (harness cases against the CPU reference,
# `backend_ops perf fp8` next to the wgmma path and PyTorch's block-scaled scaled_mm), FP8 KV decode attention timed,
# and Nsight Compute on the one-token MoE kernels.
# Usage: bench/gpu_quant2.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh plus test_paged_attention,
#        torch_fp8_peers.py and prompts.txt: one comma-separated prompt a line; STEPS: a comma-separated subset of
#        attention,fp8,generate,serve,perf,moe,torch,ncu; default all). Writes $OUT/quant2.log and $OUT/ncu.txt; prints
#        the lines that matter.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_quant2.sh CARRY_DIR [STEPS]}
STEPS=,${2:-attention,fp8,generate,serve,perf,moe,torch,ncu},
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/quant2.log
MODEL=models/beam-nano
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header

if wanted attention; then
  step 60 'fp8|FAIL|cases|passed|failed' "$OPS" test --filter attention --seed 5
  step 30 'FAILED|PASSED|OK \]|tests? ran' "$CARRY/test_paged_attention"
fi
if wanted fp8; then
  step 100 'FAIL|cases|failed|T (4|8|12|16|36|64|68|256|300) ' "$OPS" test --filter fp8 --seed 6
fi
if wanted generate; then
  # Greedy continuations of each prompt: CUDA with the FP8 KV cache against the CPU's (both FP32 compute) and against
  # the BF16 / F32 KV caches; the ids go to the log, the match rates are printed.
  n=0
  while IFS= read -r prompt; do
    n=$((n + 1))
    for config in "cuda float32 fp8" "cpu float32 fp8" "cuda float32 auto" "cuda bfloat16 auto" "cuda bfloat16 fp8"; do
      set -- $config
      ids=$(timeout 30 "$BIN" generate --model "$MODEL" --device "$1" --dtype "$2" --kv-cache-dtype "$3" \
              --tokens "$prompt" --max-tokens 96 --ignore-eos 2>>"$LOG" | grep -E '^[0-9]+(,[0-9]+)*$' | tail -1)
      echo "prompt $n $1 $2 kv $3: $ids" >>"$LOG"
      echo "$n|$1 $2 kv $3|$ids" >>"$OUT/generated.txt"
    done
  done <"$CARRY/prompts.txt"
  python3 - "$OUT/generated.txt" <<'EOF'
import collections, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    prompt, config, ids = line.rstrip("\n").split("|")
    runs[config][prompt] = ids.split(",") if ids else []
def match(a, b):
    same = total = 0
    for p in runs[a]:
        x, y = runs[a][p], runs[b].get(p, [])
        total += max(len(x), len(y))
        same += sum(1 for i, j in zip(x, y) if i == j)
    prefix = [next((i for i, (u, v) in enumerate(zip(runs[a][p], runs[b].get(p, []))) if u != v),
                   min(len(runs[a][p]), len(runs[b].get(p, [])))) for p in runs[a]]
    return f"{same}/{total} tokens equal ({100.0 * same / max(total, 1):.1f}%), identical prefixes {prefix}"
pairs = [("cuda float32 kv fp8", "cpu float32 kv fp8"), ("cuda float32 kv fp8", "cuda float32 kv auto"),
         ("cuda bfloat16 kv fp8", "cuda bfloat16 kv auto"), ("cuda float32 kv auto", "cuda bfloat16 kv auto")]
for a, b in pairs:
    print(f"generate match: {a} vs {b}: {match(a, b)}")
EOF
fi
if wanted serve; then
  # The KV capacity at the same --kv-cache-memory: the engine's startup line per --kv-cache-dtype.
  for kv in auto fp8; do
    "$BIN" serve --model "$MODEL" --device cuda --kv-cache-memory 256M --kv-cache-dtype "$kv" --port 18731 \
      >"$OUT/serve.txt" 2>&1 &
    pid=$!
    for _ in $(seq 1 60); do grep -q 'KV cache:' "$OUT/serve.txt" && break; sleep 0.25; done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    cat "$OUT/serve.txt" >>"$LOG"
    echo "serve --kv-cache-dtype $kv: $(grep -o 'KV cache:.*' "$OUT/serve.txt" | head -1)"
  done
fi
if wanted perf; then
  step 60 '^\|' "$OPS" perf fp8 --no-moe --rows 8,1024,8192 --iterations 5
  step 40 '^\||pool' "$OPS" perf attention --kv-cache-dtype fp8 --filter "decode global"
fi
if wanted moe; then
  step 40 '^\|' "$OPS" perf fp8 --no-linear --tokens 1 --iterations 20
  step 40 '^\|' "$OPS" perf micro --tokens 1 --iterations 20
fi
if wanted torch; then
  PYTHONUNBUFFERED=1 step 60 '^\||PyTorch' python3 "$CARRY/torch_fp8_peers.py" --no-moe --blockwise --rows 64,1024,8192 \
    --iterations 10
fi
if wanted ncu; then
  # One-token MoE at Beam-1.0 shapes: FP8 (gate|up, down) and NVFP4, per kernel: duration, DRAM throughput, occupancy,
  # registers, stall reasons.
  for family in fp8 micro; do
    args=(--tokens 1 --iterations 1)
    [ $family = fp8 ] && args+=(--no-linear)
    [ $family = micro ] && args+=(--formats nvfp4)
    echo "\$ ncu ... $OPS perf $family ${args[*]}" >>"$OUT/ncu.txt"
    timeout 60 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis -k 'regex:one_token|gate_up|down_kernel|route|router' \
      --launch-count 6 "$OPS" perf $family "${args[@]}" >>"$OUT/ncu.txt" 2>&1
    echo "ncu $family: exit $?"
  done
  grep -E '^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occupancy|Waves Per SM|Stall' "$OUT/ncu.txt" | head -120
fi
rm -f "$OUT/step.txt" "$OUT/serve.txt"
