#!/usr/bin/env bash
# Installs what beamline needs to build and test on Debian 12 (apt packages; npm packages for test clients).
set -euo pipefail
cd "$(dirname "$0")/.."
sudo_cmd=""
[ "$(id -u)" = 0 ] || sudo_cmd="sudo"
packages=(build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libcpp-httplib-dev libboost-dev libpcre2-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3-numpy libopenmpi-dev openmpi-bin patchelf
  gnuplot-nox clang llvm python3-torch)  # gnuplot: bench/plot_serve_sweep.sh; clang and llvm (its symbolizer):
                                         # scripts/fuzz.sh; python3-torch: the rollout loop's trainer (rollout_loop_cpu)
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for package in "${packages[@]}"; do dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package"); done
if [ ${#missing[@]} -gt 0 ]; then
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Test clients nobody here wrote (js-tiktoken for tokenizer ids, openai for the server), pinned in tests/js.
if [ -f tests/js/package.json ]; then
  (cd tests/js && npm ci --no-audit --no-fund --silent 2>/dev/null || npm install --no-audit --no-fund --silent)
fi
