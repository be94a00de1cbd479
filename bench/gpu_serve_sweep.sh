#!/usr/bin/env bash
# On the GPU machine, one call: `beamline serve` on beam-nano (or, with MODEL=beam-1.0-8, Beam-1.0's shapes cut to 8
# layers with random weights made on the device: `make-model --no-weights`, `--load-format dummy`) with CUDA (the defaults: bfloat16, BF16 KV, async
# scheduling, decode graphs) and a `beamline bench serve` --max-concurrency sweep against it. The sweep's JSONs and
# its table come back in $OUT/sweep.tar.gz, to be drawn here with bench/plot_serve_sweep.sh.
# Usage: [MODEL=beam-nano|beam-1.0-8] [SWEEP_SECONDS=50] bench/gpu_serve_sweep.sh CARRY_DIR [LEVELS (1,2,4,8,16,32,64)]
#        (CARRY_DIR from bench/make_carry.sh)
set -euo pipefail
carry=$(realpath "${1:?usage: gpu_serve_sweep.sh CARRY_DIR [LEVELS]}")
levels=${2:-1,2,4,8,16,32,64}
out=${OUT:?set OUT}
cd "$(dirname "$0")/.."
CARRY=$carry source bench/open_carry.sh
exe=$carry/apps/beamline/beamline
cat "$carry/apps/beamline/COMMIT" > "$out/machine.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >> "$out/machine.txt"
nproc >> "$out/machine.txt"

model_args=(--model models/beam-nano)
if [ "${MODEL:-beam-nano}" = beam-1.0-8 ]; then
  "$exe" make-model --preset beam-1.0 --layers 8 --no-weights --out /tmp/beam-1.0-8 > "$out/make-model.log" 2>&1
  model_args=(--model /tmp/beam-1.0-8 --load-format dummy)
fi
echo "model: ${MODEL:-beam-nano}" >> "$out/machine.txt"
source bench/serve_start.sh
serve_start "$exe" "$out/serve.log" "${model_args[@]}" --device cuda
mkdir -p /tmp/sweep
start=$(date +%s)
timeout "${SWEEP_SECONDS:-50}" "$exe" bench serve --base-url "$base" --backend openai --dataset-name random \
  --random-input-len 256 --random-output-len 64 --ignore-eos --num-prompts 64 --request-rate inf \
  --max-concurrency "$levels" --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
  --save-result --result-dir /tmp/sweep > "$out/bench.log" 2>&1 || echo "bench serve exited $?" >> "$out/bench.log"
echo "sweep wall: $(( $(date +%s) - start )) s" >> "$out/bench.log"
curl -s "$base/metrics" > "$out/metrics.txt"
tar -C /tmp/sweep -czf "$out/sweep.tar.gz" .
tail -20 "$out/bench.log"
