#!/usr/bin/env bash
# Configures and builds beamline into build/ (extra arguments go to cmake's configure step).
# The CUDA backend is built whenever the CUDA toolkit is installed (no GPU is needed to compile it);
# BEAMLINE_CUDA=OFF in the environment builds the CPU backend alone.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
cuda_args=()
if [ -n "$nvcc" ] && [ "${BEAMLINE_CUDA:-ON}" != OFF ]; then
  cuda_args=(-DBEAMLINE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" "$@"
cmake --build build -j"$(nproc)"
