#!/usr/bin/env bash
# Issue 18 in device calls on nvidia-h200-x8: the full 52-layer Beam-1.0 (--load-format dummy, 500 G parameters:
# 1.0 TB in BF16, 0.50 TB in FP8) served over eight GPUs. Steps (STEPS, comma-separated; default all):
#   logits    TP8 and TP8 with expert parallelism against TP1 on Beam-1.0 cut to 4 layers (fits one GPU), bfloat16
#             (argmax >= 99%) and float32 (relative error <= 1e-5), and TP8 with expert parallelism in FP8
#             (--quantization fp8: each rank quantizes its part at load and slices it; without expert parallelism the
#             experts' 320 rows a rank are refused in FP8) against TP1 in FP8, bfloat16: 5 rows (compare_logits.py's
#             `parallel` modes).
#   tp8-bf16  serve --tensor-parallel-size 8 --enable-expert-parallel, BF16 (~125 GB of weights a GPU);
#   tp8-fp8   the same with --quantization fp8 (dummy weights drawn and quantized on the host at load);
#   dp8-fp8   serve --data-parallel-size 8 --enable-expert-parallel --quantization fp8 (eight engines, shared experts).
#             Each of the three: serve_throughput.py at batch 1, 16, 64, 256 with 8K prompts (the decode step where
#             every request decodes, and prefill tokens/s, batch 1 being one 8K prompt), next to the weights' floor of
#             a batch-1 step split evenly over 8 GPUs; the load time (the server's "starting 8 ranks" to "serving"
#             log lines), the KV capacity (its "KV cache:" line) and each GPU's peak memory (nvidia-smi every 500 ms).
#             A row per layout in the Checks table says it loaded and printed its 4 batch rows.
#   sweep     serve TP8 + EP (BF16; SWEEP_QUANTIZATION=fp8 for FP8) and `beamline bench serve` at concurrency 1, 4,
#             16, 64, 256 (random 1K-token prompts, SWEEP_OUTPUT tokens out, default 256; 2 x concurrency requests a
#             level, at least 4), then a multi-turn replay (32 sessions x 4 turns, concurrency 16) with its
#             prefix-cache hit rate from /metrics: output tokens/s, TTFT and TPOT percentiles a level.
# Goals at batch 1 (issue 18): <= 1.6 ms FP8, <= 2.5 ms BF16 (vLLM's day-0 figure: 3.30 ms on GB200); the projection
# made on one GPU is bench/results/2026-12-02-tp8-rank-projection.md. Not in this script: prefill at 128K, the TTFT of
# one 1M-token prompt with the FP8 KV cache (bench/gpu_long_context.sh's request, which would need its model flags),
# speculative decoding (no drafter for Beam-1.0).
# Known before running (2026-12-03): with --quantization fp8 each rank draws and quantizes on the host only what it
# computes (docs/parallel.md, Quantized weights: ~66 GB a rank for TP8 + EP, ~530 GB of the host's 560 GiB for
# eight ranks, kept while serving); BF16 at batch 256 x 8K
# needs ~13 GB of KV a GPU beside 125 GB of weights: it may not fit, and its row then fails with the server's reason.
# Time (estimate): logits ~90 s; tp8-bf16 ~150 s; tp8-fp8 and dp8-fp8 ~120 s of host quantizing at load + ~120 s
# each; sweep ~150 s. All steps exceed one 600 s call: run `logits,tp8-bf16,sweep` and `tp8-fp8,dp8-fp8` as two
# calls (each step is bounded by a timeout, so a call that runs long loses only its last step).
# Usage: bench/gpu_eight.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh)
#        DEVICE=cpu SMALL=1 bench/gpu_eight.sh BUILD_DIR: the dry run here (eight ranks as processes on the CPU
#        backend, the tiny preset with 8 attention heads, 256-token prompts, short sweep; the same steps and rows).
#        Writes $OUT/gpu_eight.md (the report), $OUT/gpu_eight.log, $OUT/sweep/ (bench serve's JSONs). The exit
#        status is 0 only when every check ran and passed.
set -uo pipefail
CARRY=$(realpath "${1:?usage: bench/gpu_eight.sh CARRY_DIR [STEPS]}")
STEPS=,${2:-logits,tp8-bf16,tp8-fp8,dp8-fp8,sweep},
cd "$(dirname "$0")/.."
NAME=gpu_eight GPUS=8 TITLE="Eight GPUs: the full Beam-1.0 served, FP8 and BF16 (issue 18)"
SMALL_NOTE="tiny preset with 8 heads, short prompts"
source bench/multi_gpu_start.sh
mkdir -p "$OUT/sweep"
if [ "${SMALL:-0}" = 1 ]; then
  preset=tiny overrides='{"num_attention_heads": 8}' logits_overrides='{"num_hidden_layers": 4, "num_attention_heads": 8}'
  tokens_count=24 vocab=512 prompt=256 decode=16 sweep_input=64 sweep_output=${SWEEP_OUTPUT:-16} levels=1,4,16
  budget=(--kv-cache-memory 512M) sweep_budget=(--kv-cache-memory 512M) serve_limit=300 batches=1,4,16,64
else
  preset=beam-1.0 overrides="" logits_overrides='{"num_hidden_layers": 4}'
  tokens_count=256 vocab=201088 prompt=8192 decode=32 sweep_input=1024 sweep_output=${SWEEP_OUTPUT:-256}
  levels=1,4,16,64,256 budget=() sweep_budget=(--gpu-memory-utilization 0.95) serve_limit=330 batches=1,16,64,256
fi

# The served model's directory (config and the 201K-token synthetic tokenizer, ~40 s of one core), written while the
# logits run.
"$BIN" make-model --preset "$preset" --no-weights --out "$WORK/model" >"$WORK/make-model.log" 2>&1 &
maker=$!

if wanted logits; then
  tokens=$(python3 -c "import random; r = random.Random(18); print(','.join(str(r.randrange(min($vocab, 100000))) for _ in range($tokens_count)))")
  model_args=(--model "$preset" --load-format dummy --hf-overrides "$logits_overrides")
  name="$preset cut to 4 layers, --load-format dummy, $tokens_count tokens"
  for dtype in bfloat16 float32; do
    parallel_logits_rows "$name" "$dtype" "$dtype" "$tokens" "TP8|--tensor-parallel-size 8" \
      "TP8+EP|--tensor-parallel-size 8 --enable-expert-parallel"
  done
  model_args+=(--quantization fp8)
  parallel_logits_rows "$name, --quantization fp8" fp8-bfloat16 bfloat16 "$tokens" \
    "TP8+EP|--tensor-parallel-size 8 --enable-expert-parallel"
fi

if ! wait "$maker"; then
  check_row "make-model --preset $preset --no-weights (nothing was served)" "$(tail -1 "$WORK/make-model.log")" "exit 0" 0
  STEPS=,
fi
# Bytes a batch-1 decode step must read, without the embedding (one row of it is read): BF16, or FP8 projections
# with the LM head kept in BF16 (scales, norms and the F32 router left out).
floor_bytes() {  # bf16 | fp8
  "$BIN" make-model --config "$WORK/model/config.json" --dry-run | python3 -c "
import json, sys
values = dict(line.split(': ', 1) for line in sys.stdin if line.startswith('active parameters per token'))
config = json.load(open('$WORK/model/config.json'))
table = config['vocab_size'] * config['hidden_size']
active = int(values['active parameters per token']) - table
print(2 * active if '$1' == 'bf16' else active + table)"
}
[ -n "$overrides" ] && hf=(--hf-overrides "$overrides") || hf=()

# Seconds between two log lines' timestamps ([YYYY-MM-DD HH:MM:SS.mmm]): the first matching each pattern.
seconds_between() {  # file, first pattern, second pattern
  python3 - "$@" <<'EOF'
import re, sys
from datetime import datetime
text = open(sys.argv[1], errors="replace").read().splitlines()
def stamp(pattern):
    for line in text:
        if re.search(pattern, line):
            found = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]", line)
            if found:
                return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S.%f")
    return None
start, end = stamp(sys.argv[2]), stamp(sys.argv[3])
print(f"{(end - start).total_seconds():.1f} s" if start and end else "not in the log")
EOF
}
# Starts sampling every GPU's used memory; gpu_peaks prints each GPU's peak since then.
gpu_sampling() {
  sampler=
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$WORK/memory.csv" &
    sampler=$!
  fi
}
gpu_peaks() {
  if [ -z "$sampler" ]; then echo "not measured (no nvidia-smi: the CPU backend)"; return; fi
  kill "$sampler"
  wait "$sampler" 2>/dev/null
  awk -F', *' '{ if ($2 > peak[$1]) peak[$1] = $2 } END { for (g in peak) printf "GPU %s %.1f GiB, ", g, peak[g] / 1024 }' \
    "$WORK/memory.csv" | sed 's/, $//'
}

timings=""
for config in "tp8-bf16|TP8 + EP, BF16|--tensor-parallel-size 8 --enable-expert-parallel|bf16" \
              "tp8-fp8|TP8 + EP, FP8|--tensor-parallel-size 8 --enable-expert-parallel --quantization fp8|fp8" \
              "dp8-fp8|DP8 + EP8, FP8|--data-parallel-size 8 --enable-expert-parallel --quantization fp8|fp8"; do
  IFS='|' read -r key label serve_args weights <<<"$config"
  wanted "$key" || continue
  floor=$(floor_bytes "$weights")
  gpu_sampling
  echo "\$ serve $label" >>"$LOG"
  output=$(step "$serve_limit" "^[|\`]|starting [0-9]+ ranks|serving '|KV cache:|rror|refused|not supported|assert" \
    python3 bench/serve_throughput.py "$BIN" "$WORK/model" --batches "$batches" --prompt "$prompt" \
    --decode "$decode" --device "$DEVICE" --floor-bytes $((floor / 8)) "${hf[@]}" \
    --serve-args "$serve_args ${budget[*]}")
  peaks=$(gpu_peaks)
  echo "$output" >"$WORK/$key.txt"
  rows=$(echo "$output" | grep -cE '^\| [0-9]+ \|')
  why=$(echo "$output" | grep -m1 -E 'rror|refused|not supported|assert' | sed 's/\x1b\[[0-9;]*m//g; s/|/\//g' | cut -c1-220)
  check_row "$label: the full $preset served, decode and prefill timed at batch ${batches//,/, }" \
    "$rows of 4 batch rows${why:+; first error: $why}" "4 rows" "$([ "$rows" = 4 ] && echo 1 || echo 0)"
  kv=$(echo "$output" | grep -m1 -o 'KV cache: .*' | cut -c1-200)
  timings="$timings
### $label

| | |
| --- | --- |
| load (\"starting ranks\" to \"serving\") | $(seconds_between "$WORK/$key.txt" 'starting [0-9]+ ranks' "serving '") |
| KV capacity | ${kv:-not in the log} |
| peak memory per GPU (nvidia-smi, every 500 ms) | $peaks |
| floor of a batch-1 step | $floor bytes ($weights weights without the embedding) / 8 GPUs at 4.8 TB/s: $(python3 -c "print(f'{$floor / 8 / 4.8e12 * 1e3:.2f}')") ms |

$(echo "$output" | grep -E '^[|`]')
"
done

sweep_rows=""
if wanted sweep; then
  source bench/serve_start.sh
  export SERVE_START_SECONDS=300  # the full model's load (FP8: quantized on the host)
  quantization=()
  [ "${SWEEP_QUANTIZATION:-}" = fp8 ] && quantization=(--quantization fp8)
  if serve_start "$BIN" "$OUT/sweep-server.log" --model "$WORK/model" --load-format dummy --device "$DEVICE" \
      --tensor-parallel-size 8 --enable-expert-parallel "${quantization[@]}" "${hf[@]}" "${sweep_budget[@]}" \
      --max-num-seqs 256; then
    # serve_start returns once the address is printed; the model is loaded before that line.
    done_levels=0
    for level in ${levels//,/ }; do
      prompts=$((2 * level > 4 ? 2 * level : 4))
      logged timeout 200 "$BIN" bench serve --base-url "$base" --backend openai --dataset-name random \
        --random-input-len "$sweep_input" --random-output-len "$sweep_output" --ignore-eos --num-prompts "$prompts" \
        --max-concurrency "$level" --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
        --save-result --result-dir "$OUT/sweep" --result-filename "random-concurrency$level.json" &&
        done_levels=$((done_levels + 1))
    done
    hits_before=$(metric vllm:prefix_cache_hits_total) queries_before=$(metric vllm:prefix_cache_queries_total)
    logged timeout 200 "$BIN" bench serve --base-url "$base" --backend openai --dataset-name multi-turn \
      --num-sessions 32 --num-turns 4 --random-input-len "$((sweep_input / 2))" --random-output-len "$sweep_output" \
      --ignore-eos --max-concurrency 16 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
      --save-result --result-dir "$OUT/sweep" --result-filename multi-turn-concurrency16.json &&
      done_levels=$((done_levels + 1))
    hit_rate=$(python3 -c "
hits, queries = float('${hits_before:-0}' or 0), float('${queries_before:-0}' or 0)
h, q = float('$(metric vllm:prefix_cache_hits_total)' or 0), float('$(metric vllm:prefix_cache_queries_total)' or 0)
print(f'{(h - hits) / (q - queries):.1%} of {q - queries:.0f} prompt tokens' if q > queries else 'no queries')")
    kill "$server"
    wait "$server" 2>/dev/null
    owed=$(( $(echo "${levels//,/ }" | wc -w) + 1 ))
    check_row "bench serve sweep (${levels}) and multi-turn replay against TP8 + EP" "$done_levels of $owed runs" \
      "$owed runs" "$([ "$done_levels" = "$owed" ] && echo 1 || echo 0)"
    sweep_rows=$(python3 - "$OUT/sweep" "$hit_rate" <<'EOF'
import glob, json, os, sys
print("| run | completed | output tokens/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p99 ms |")
print("| --- | --- | --- | --- | --- | --- |")
def level(path):
    return int(os.path.basename(path).split("concurrency")[1].split(".")[0])
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")), key=lambda p: ("multi" in p, level(p))):
    r = json.load(open(path))
    name = os.path.basename(path)[:-5]
    if name.startswith("multi-turn"):
        name += f" (prefix-cache hit rate {sys.argv[2]})"
    g = lambda key: r.get(key, float("nan"))
    print(f"| {name} | {g('completed')} | {g('output_throughput'):.0f} | {g('median_ttft_ms'):.1f} / {g('p99_ttft_ms'):.1f} "
          f"| {g('median_tpot_ms'):.2f} / {g('p99_tpot_ms'):.2f} | {g('p99_itl_ms'):.2f} |")
EOF
)
  else
    check_row "bench serve sweep against TP8 + EP" "the server did not start: $(grep -m1 -E 'rror' "$OUT/sweep-server.log" | cut -c1-160)" \
      "" "not run"
  fi
fi

info_row "prefill at 128K, TTFT of one 1M-token prompt with the FP8 KV cache" "not in this script (see its header)"
info_row "speculative decoding in the sweep" "not run: no drafter for Beam-1.0"
info_section
if [ -n "$timings" ]; then
  section "Served layouts: load, memory, KV, decode step and prefill (serve_throughput.py, --load-format dummy)"
  echo "Floors divide the weights of a batch-1 step evenly over 8 GPUs (expert parallelism reads the busiest GPU's" \
    "experts; collectives not counted); batches 16-256 read more experts than batch 1. Goals at batch 1: <= 1.6 ms" \
    "FP8, <= 2.5 ms BF16." >>"$REPORT"
  echo "$timings" >>"$REPORT"
fi
if [ -n "$sweep_rows" ]; then
  section "Serving sweep (bench serve; JSONs in sweep/)"
  echo "Random ${sweep_input}-token prompts, $sweep_output tokens out (ignore_eos), 2 x concurrency requests a level" \
    "(at least 4); multi-turn: 32 sessions x 4 turns." >>"$REPORT"
  echo >>"$REPORT"
  echo "$sweep_rows" >>"$REPORT"
fi

check_result
status=$?
cat "$REPORT"
rm -rf "$WORK" "$INFO" "$OUT/step.txt"
exit $status
