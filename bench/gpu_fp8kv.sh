#!/usr/bin/env bash
# Branch fp8kv's decode attention versions over FP8 KV pools in one GPU call (issue 14: >= 85% of the bandwidth roof at
# B=1 L=128K, B=32 L=8K, B=128 L=4K and the 1M-context decode; bench/results/2026-12-03-fp8kv.md). Each version of
# the split-KV decode kernel (BEAMLINE_CUDA_DECODE_ATTENTION: legacy, per-tile, keys-cvt, unset = query-rows,
# query-rows-keys-bits, query-rows-values-bits, query-rows-bulk) first runs against the CPU reference (the harness's
# kv_decode group: attention's E4M3 decode-only cases, 32K rows included, and test_paged_attention's FP8 cases), then
# every version is timed in the same call next to the floor (K and V bytes / 4.8 TB/s): as back-to-back calls (as
# bench/gpu_fp8dec.sh timed them) and replayed as CUDA graphs (no host work per call, as in the decode step: what
# decides B=1 L=8K), with the BF16 pool's kernel for reference. Where Nsight Compute is installed, one profile of the
# default, the query-rows and the query-rows-bulk kernels at B=32 L=8K (issue, pipes, stalls, memory) goes to
# $OUT/ncu-*.txt.
# Usage: bench/gpu_fp8kv.sh CARRY_DIR   (CARRY_DIR from `bench/make_carry.sh --tests build CARRY_DIR`); writes
#        $OUT/fp8kv.log (every command's whole output), $OUT/fp8kv-summary.md (ms and % of floor per version and shape,
#        both timings), and exits 1 when a test failed or did not run, or a perf row is missing. At most 420 s once
#        the machine is up (each step's limit is cut to what is left of that).
set -uo pipefail
CARRY=${1:?usage: bench/gpu_fp8kv.sh CARRY_DIR}
OUT=${OUT:-$(mktemp -d)}
BIN=$PWD/$CARRY/apps/beamline/beamline
OPS=$PWD/$CARRY/tests/backend_ops/backend_ops
LOG=$OUT/fp8kv.log
STEPS=,all,
source bench/open_carry.sh
source bench/cuda_env.sh
export BEAMLINE_REQUIRE_CUDA=1
source bench/gpu_steps.sh
log_header
problems=()
budget=418
versions=(legacy per-tile keys-cvt default query-rows-keys-bits query-rows-values-bits query-rows-bulk)
with_version() {  # version, command...: the command under that decode attention version
  local version=$1
  shift
  BEAMLINE_CUDA_DECODE_ATTENTION=$([ "$version" = default ] || echo "$version") "$@"
}

echo "=== correctness: each version against the CPU reference (harness kv_decode, test_paged_attention *Fp8*)"
tests_dir=$(mktemp -d)
export LD_LIBRARY_PATH="$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tar -xJf "$CARRY/tests.tar.xz" -C "$tests_dir" tests/test_paged_attention 2>>"$LOG" ||
  problems+=("test_paged_attention: not in $CARRY/tests.tar.xz (make the carry with --tests)")
# The whole attention group once, default versions: the BF16 pools' decode kernel changed too (the warps' O layout in
# shared memory, the first tiles' table entries loaded together).
limit=$(limit_of 60)
echo "--- attention group, default versions"
step "$limit" 'FAIL|cases,' "$OPS" test --small --filter attention --seed 30
grep -qE '^[1-9][0-9]* cases, 0 failed$' "$OUT/step.txt" || problems+=("attention (default): failed or did not run")
seed=31
for version in "${versions[@]}"; do
  limit=$(limit_of 30)
  if [ "$limit" -le 0 ]; then problems+=("kv_decode ($version): not run (budget)"); continue; fi
  echo "--- $version"
  with_version "$version" step "$limit" 'FAIL|cases,' "$OPS" test --filter kv_decode --seed $((seed++))
  grep -qE '^[1-9][0-9]* cases, 0 failed$' "$OUT/step.txt" || problems+=("kv_decode ($version): failed or did not run")
  if [ -x "$tests_dir/tests/test_paged_attention" ]; then
    limit=$(limit_of 12)
    with_version "$version" step "$limit" 'FAILED|PASSED|tests? ran' "$tests_dir/tests/test_paged_attention" \
      --gtest_filter='*Fp8*'
    grep -q '\[  PASSED  \]' "$OUT/step.txt" && ! grep -q '\[  FAILED  \]' "$OUT/step.txt" ||
      problems+=("test_paged_attention ($version): failed or did not run")
  fi
done

# Every decode global row (B=1 at 8K, 32K, 128K and 1M keys, B=32 L=8K, B=128 L=4K) per version and timing; each
# table also goes to $OUT/perf-<timing>-<pool>-<version>.txt for the summary.
rows="decode global B=1 L=8K;decode global B=1 L=128K;decode global B=1 L=1M;decode global B=32 L=8K"
rows+=";decode global B=128 L=4K"
perf() {  # timing (calls|graph), pool dtype, version
  local timing=$1 dtype=$2 version=$3 limit row
  limit=$(limit_of 25)
  echo "--- $dtype pool, $version, $timing"
  if [ "$limit" -le 0 ]; then problems+=("perf $dtype $version $timing: not run (budget)"); return; fi
  local -a flags=()
  [ "$timing" = graph ] && flags=(--graph)
  with_version "$version" step "$limit" '^\| decode' "$OPS" perf attention --kv-cache-dtype "$dtype" \
    --filter "decode global" ${flags[@]+"${flags[@]}"}
  cp "$OUT/step.txt" "$OUT/perf-$timing-$dtype-$version.txt"
  local -a expected
  IFS=';' read -ra expected <<<"$rows"
  for row in "${expected[@]}"; do
    grep -q "^| $row |" "$OUT/step.txt" || problems+=("perf $dtype $version $timing: no row '$row'")
  done
}
echo "=== perf: FP8 pools, every version, graph replays then back-to-back calls; the BF16 pool's kernel"
for timing in graph calls; do
  for version in "${versions[@]}"; do perf "$timing" fp8 "$version"; done
  perf "$timing" bfloat16 default
done

echo "=== Nsight Compute at B=32 L=8K (optional)"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  for version in per-tile default query-rows-bulk; do
    limit=$(limit_of 60)
    [ "$limit" -le 0 ] && break
    with_version "$version" step "$limit" 'ERR|Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc A|No Eligible' \
      "$ncu" --kernel-name regex:decode_attention_mma --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section Occupancy \
      --section SchedulerStats --section MemoryWorkloadAnalysis "$OPS" perf attention --kv-cache-dtype fp8 \
      --filter "decode global B=32 L=8K" --iterations 1 --repeats 1
    cp "$OUT/step.txt" "$OUT/ncu-$version.txt"
  done
else
  echo "no ncu on this machine: no profile (not a failure)"
fi
rm -f "$OUT/step.txt"

# One table: per shape, each version's ms and % of floor in both timings, the fastest FP8 version per shape and timing.
python3 - "$OUT" "${versions[@]}" <<'EOF' | tee "$OUT/fp8kv-summary.md"
import os, sys
out, versions = sys.argv[1], sys.argv[2:]
def table(timing, dtype, version):
    rows = {}
    path = os.path.join(out, f"perf-{timing}-{dtype}-{version}.txt")
    if os.path.exists(path):
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 6 and cells[0].startswith("decode"):
                rows[cells[0]] = (float(cells[1]), cells[5], cells[4])
    return rows
for timing in ("graph", "calls"):
    tables = {v: table(timing, "fp8", v) for v in versions}
    bf16 = table(timing, "bfloat16", "default")
    shapes = list(dict.fromkeys(s for v in versions for s in tables[v]))
    print(f"\n### FP8 KV decode attention, {'one CUDA graph per sample' if timing == 'graph' else 'back-to-back calls'}:"
          " ms (% of floor)\n")
    print("| shape | floor ms | " + " | ".join(versions) + " | fastest | BF16 pool (per-tile) |")
    print("| --- | --- | " + " | ".join("---" for _ in versions) + " | --- | --- |")
    for shape in shapes:
        cells, floor = [], ""
        for v in versions:
            row = tables[v].get(shape)
            cells.append(f"{row[0]:.4f} ({row[1]})" if row else "missing")
            floor = floor or (row[2] if row else "")
        timed = [(tables[v][shape][0], v) for v in versions if shape in tables[v]]
        fastest = min(timed)[1] if timed else "-"
        b = bf16.get(shape)
        print(f"| {shape} | {floor} | " + " | ".join(cells) + f" | {fastest} | " +
              (f"{b[0]:.4f} ({b[1]})" if b else "missing") + " |")
EOF

cat <<'EOF'

=== before this branch (H200, 2026-12-03 15:20 UTC, bench/results/2026-12-03-session8-final.md, back-to-back calls)
FP8 KV decode, per-tile (default) / legacy / keys-cvt: B=1 L=8K 0.0204 / 0.0183 / 0.0200 ms; B=1 L=128K 0.0842 (66%)
  / 0.0953 (59%) / 0.0826 (68%); B=32 L=8K 0.1587 (70%) / 0.1803 (62%) / 0.1559 (72%); B=128 L=4K 0.3323 (67%) /
  0.3729 (60%) / 0.3191 (70%). Goal >= 85% of the floor.
EOF
if [ ${#problems[@]} -gt 0 ]; then
  printf 'PROBLEM: %s\n' "${problems[@]}"
  exit 1
fi
echo "all tests passed and every perf row came out"
