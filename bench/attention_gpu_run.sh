#!/usr/bin/env bash
# One GPU-machine call for the attention kernels: the attention cases of the op harness against the CPU, then
# `beamline bench-attention` and the PyTorch peers (bench/torch_attention_peers.py) on the same GPU.
# Usage (on the GPU machine, after bench/make_carry.sh BUILD CARRY): bench/attention_gpu_run.sh CARRY
# Writes $OUT/attention_tests.log, $OUT/attention_bench.md and $OUT/attention_peers.md when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${1:?usage: bench/attention_gpu_run.sh CARRY_DIR}
BIN="$carry/apps/beamline/beamline"
out=${OUT:-/tmp}
# libcublas.so.13 from the CUDA toolkit or PyTorch's nvidia-cublas package, as bench/gpu_check.sh finds it.
if ! ldd "$BIN" | grep -q 'libcublas.so.13 => /'; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d) for p in nvidia.__path__ for d in ("cu13/lib", "cublas/lib")))' 2>/dev/null); do
    if [ -e "$dir/libcublas.so.13" ]; then export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
  done
fi
echo "commit $(cat "$carry/apps/beamline/COMMIT" | tr '\n' ' ')"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader
"$BIN" test-backend-ops --device cuda --reference cpu --seed 3 --filter attention 2>&1 | tee "$out/attention_tests.log" |
  grep -E 'FAIL|cases,|error'
"$BIN" bench-attention 2>&1 | tee "$out/attention_bench.md"
PYTHONUNBUFFERED=1 python3 bench/torch_attention_peers.py 2>&1 | tee "$out/attention_peers.md"
