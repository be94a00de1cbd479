#!/usr/bin/env bash
# Builds the Debian package beamline_<version>_amd64.deb (cmake/packaging.cmake says what goes where) from a
# configured build folder: builds the binary, then runs `cpack -G DEB`. Prints the package's path last.
# Usage: scripts/package.sh [BUILD_DIR (build)] [OUT_DIR (BUILD_DIR)]
set -euo pipefail
build=$(realpath "${1:-build}")
out=$(realpath -m "${2:-$build}")
[ -f "$build/CPackConfig.cmake" ] || { echo "$build: not a configured build folder (run scripts/build.sh)" >&2; exit 1; }
cmake --build "$build" -j2 --target beamline
mkdir -p "$out"
log=$(cd "$build" && cpack -G DEB -B "$out" 2>&1) || { echo "$log" >&2; exit 1; }
package=$(echo "$log" | sed -n 's/^CPack: - package: \(.*\.deb\) generated\.$/\1/p')
[ -f "$package" ] || { echo "$log" >&2; echo "cpack wrote no .deb" >&2; exit 1; }
echo "$package"
