#!/usr/bin/env bash
# bench/perf_goals.py (gpu_perf.sh's goal table) on tests/data/perf_goals, step outputs in the formats the GPU steps
# print: every goal row with its verdict, peer and measured limit, exit 0; a row that meets its goal says so; with the
# roof step failed and the MoE peers absent, the rows that need them say "not run" and why, exit 1; --dry-run marks
# every row not run.
# Usage: tests/scripts/perf_goals.sh [PYTHON]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${1:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
goals() {  # FOLDER ARGS...: the table to $work/goals.md, the exit status to $work/status
  local status=0
  "$python" "$root/bench/perf_goals.py" "$@" >"$work/goals.md" || status=$?
  echo "$status" >"$work/status"
}
expect() {  # TEXT: a line of the last table
  grep -qF -- "$1" "$work/goals.md" || { echo "perf_goals: no '$1' in:"; cat "$work/goals.md"; exit 1; }
}
expect_status() {
  [ "$(cat "$work/status")" = "$1" ] || { echo "perf_goals: exit $(cat "$work/status"), expected $1"; exit 1; }
}

goals "$root/tests/data/perf_goals" --json "$work/goals.json"
expect_status 0
expect '| MoE layer, 1 token, all-in (route + experts, CUDA graph) | 0.190 ms | ≤ 0.150 ms | short: 27% over (1.27×) | PyTorch 0.731 ms (0.18 of its floor, 8 experts) | route 0.0288 ms (15% of the layer); experts 0.161 ms at 3.90 TB/s; read roof 4.28 TB/s at 634 MB (0.89 of 4.8): the layer'"'"'s bytes at the roof take 0.148 ms |'
expect '| MoE layer, 8,192 tokens (prefill) | 29.551 ms | ≤ 11.3 ms | short: 162% over (2.62×) | PyTorch 18.70 ms |'
expect 'cuBLAS on the same FLOPs as dense GEMMs 7.60 ms (677 TFLOP/s) |'
expect '| prefill attention, causal 8K, TFLOP/s | 209 TFLOP/s | ≥ SDPA (543 TFLOP/s) | short: 61% below (0.39× the goal) | SDPA 543 TFLOP/s |'
expect '| sliding-window-512 prefill 32K, TFLOP/s | 136 TFLOP/s | ≥ 2 × flex_attention (416 TFLOP/s) |'
expect '| paged decode attention B=128 L=4K | 0.91 of floor (0.4893 ms) | ≥ 0.92 of floor | short: 1% below (0.99× the goal) | SDPA (unpaged) 0.93 of floor | read roof 4.36 TB/s at 2147 MB (0.91 of 4.8); ours 4.39 TB/s = 1.01 of the roof |'
expect '| 8-layer Beam-1.0 decode step, batch 1, 8K context | 2.450 ms | ≤ 2.08 ms | short: 18% over (1.18×) |'
expect 'device time per step (graph replay) 2.728 ms of a 2.80 ms step in the same run (3% host); the step'"'"'s bytes at the read roof (4.40 TB/s at 8293 MB): 1.88 ms; op by op (16-token context): moe 24%, route 17%, swiglu 15%, lm_head 13%; gaps between ops 3.6%; kernels 2305 µs of a 2391 µs step span (4% between kernels)'
expect '| prefill throughput, 8K prompts | 0.32 of floor (39,279 tokens/s, batch 16) | ≥ 0.60 of the GEMM-FLOP floor | short: 46% below (0.54× the goal) | — | cuBLAS on the step'"'"'s GEMMs 75.0 ms for 8,192 tokens (678 TFLOP/s, 0.89 of the floor)'
expect 'ours 208.6 ms per 8,192 tokens (244 TFLOP/s of GEMM work); prefill op by op (serve, batch 1, 8K prompt): route 31%, moe 31%, linear_many 23%, swiglu 6%'
expect '0 of 13 goals met; 0 row(s) with something not run'
"$python" -c 'import json, sys; rows = json.load(open(sys.argv[1]))["rows"]; assert len(rows) == 13, rows' \
  "$work/goals.json"

# A server's log line between two rows of the serve table (its stderr shares the step's output) ends nothing.
cp -r "$root/tests/data/perf_goals" "$work/logged"
sed -i '/^| 1 | 0.26 |/a [2026-12-03 17:47:53.000] [warning] a log line between two rows' "$work/logged/serve.txt"
goals "$work/logged"
expect_status 0
expect '| prefill throughput, 8K prompts | 0.32 of floor (39,279 tokens/s, batch 16) |'

# A row at its goal: B=128 L=4K at 93% of its floor.
cp -r "$root/tests/data/perf_goals" "$work/met"
sed -i 's/^| decode global B=128 L=4K | \(.*\) | 91% |$/| decode global B=128 L=4K | \1 | 93% |/' "$work/met/attention-decode.txt"
goals "$work/met"
expect_status 0
expect '| paged decode attention B=128 L=4K | 0.93 of floor (0.4893 ms) | ≥ 0.92 of floor | **met** |'
expect '1 of 13 goals met'

# No Nsight Systems on the GPU machine: the decode step's limit goes without the per-kernel part, nothing is not run.
rm "$work/met/profile.txt"
sed -i 's/^profile\t0\t.*/profile\tskipped: no nsys on this machine\t0\t0/' "$work/met/steps.tsv"
goals "$work/met"
expect_status 0
expect 'gaps between ops 3.6%; no per-kernel profile (skipped: no nsys on this machine) |'

# The roof step failed and the MoE peers did not run: those rows' limits and peers say so, exit 1.
cp -r "$root/tests/data/perf_goals" "$work/partial"
rm "$work/partial/roof.txt" "$work/partial/moe-peers.txt"
sed -i -e 's/^roof\t0/roof\t1/' -e '/^moe-peers\t/d' "$work/partial/steps.tsv"
goals "$work/partial"
expect_status 1
expect '| MoE layer, 16 tokens, all-in (108 experts) | 0.88 of floor (2.002 ms) | ≥ 0.97 of floor | short: 9% below (0.91× the goal) | not run (step moe-peers was not in this call) | route 0.0405 ms (2% of the layer); experts 1.961 ms at 4.33 TB/s; not run (step roof exited 1) |'
expect '13 row(s) with something not run'

# No step ran: every row not run, exit 1.
mkdir "$work/none"
goals "$work/none" --dry-run
expect_status 1
expect '| 8-layer Beam-1.0 decode step, batch 1, 8K context | not run (step serve was not in this call) | ≤ 2.08 ms | not run (dry run without a GPU) |'
echo "perf_goals: all checks passed"
