#!/usr/bin/env bash
# Builds (if needed) and runs every test: C++ unit tests and the scripted end-to-end tests, via CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
