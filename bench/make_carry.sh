#!/usr/bin/env bash
# Packs a CUDA-enabled build for the GPU machine: the stripped `beamline` binary, its carried HTTP library and the
# commit it was built from, small enough to travel with the working tree (the build folder itself does not fit).
# Usage: bench/make_carry.sh BUILD_DIR CARRY_DIR   then carry CARRY_DIR and run e.g. bench/gpu_check.sh CARRY_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/make_carry.sh BUILD_DIR CARRY_DIR}
carry=${2:?usage: bench/make_carry.sh BUILD_DIR CARRY_DIR}
[ -x "$build/apps/beamline/beamline" ] || { echo "make_carry: $build/apps/beamline/beamline is not built" >&2; exit 1; }
rm -rf "$carry"
mkdir -p "$carry/apps/beamline"
strip -o "$carry/apps/beamline/beamline" "$build/apps/beamline/beamline"
cp -a "$build/apps/beamline/lib" "$carry/apps/beamline/lib"
git rev-parse --short HEAD >"$carry/apps/beamline/COMMIT"
if ! git diff --quiet HEAD -- src apps; then echo "+uncommitted" >>"$carry/apps/beamline/COMMIT"; fi
du -sh "$carry"
