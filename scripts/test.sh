#!/usr/bin/env bash
# Builds (if needed) and runs every test: C++ unit tests and the scripted end-to-end tests, via CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
# The o200k rank file for the Harmony token-id vectors, rebuilt from the js-tiktoken npm package (never committed).
if [ -d tests/js/node_modules/js-tiktoken ] && [ ! -s build/testdata/o200k_base.tiktoken ]; then
  mkdir -p build/testdata
  node tests/js/export_o200k.mjs build/testdata/o200k_base.tiktoken
fi
ctest --test-dir build --output-on-failure -j"$(nproc)"
