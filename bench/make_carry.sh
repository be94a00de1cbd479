#!/usr/bin/env bash
# Packs a CUDA-enabled build for the GPU machine, small enough to travel with the working tree (the build folder
# itself does not fit): the stripped `beamline` binary, its carried HTTP library, the op harness
# (tests/backend_ops/backend_ops) and the commit they were built from.
# With --tests, also the CTest suite's test programs for bench/gpu_ctest.sh: every gtest executable, stripped, in
# tests.tar.xz (one xz stream, so the code they share is stored about once), the harness's CTest entries
# (tests/HARNESS_TESTS), the o200k rank file the Harmony tests read when this build has it (testdata/), and in
# tests/NOT_CARRIED the CTest entries that stay behind (the host-side scripted tests).
# Everything but tests.tar.xz travels in programs.tar.xz (bench/open_carry.sh unpacks it on the GPU machine), so that
# the working tree and the carry stay under the device tool's 64 MiB.
# Usage: bench/make_carry.sh [--tests] BUILD_DIR CARRY_DIR   then carry CARRY_DIR and run e.g.
#        bench/gpu_check.sh CARRY_DIR or bench/gpu_ctest.sh CARRY_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
if [ "${1:-}" = --tests ]; then
  tests=1
  shift
fi
build=${1:?usage: bench/make_carry.sh [--tests] BUILD_DIR CARRY_DIR}
carry=${2:?usage: bench/make_carry.sh [--tests] BUILD_DIR CARRY_DIR}
for program in apps/beamline/beamline tests/backend_ops/backend_ops; do
  [ -x "$build/$program" ] || { echo "make_carry: $build/$program is not built" >&2; exit 1; }
done
rm -rf "$carry"
mkdir -p "$carry/apps/beamline" "$carry/tests/backend_ops"
strip -o "$carry/apps/beamline/beamline" "$build/apps/beamline/beamline"
strip -o "$carry/tests/backend_ops/backend_ops" "$build/tests/backend_ops/backend_ops"
cp -a "$build/apps/beamline/lib" "$carry/apps/beamline/lib"
# Open MPI's launcher (mpirun, orted, its MCA plugins and help files, PMIx) from this machine's Debian packages, for a
# GPU machine without Open MPI 4: bench/carried_mpi.sh points OPAL_PREFIX at apps/beamline/mpi there. The binary's
# own libmpi, libopen-rte and libopen-pal are the ones in apps/beamline/lib.
mpi=$carry/apps/beamline/mpi
plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 pmix=/usr/lib/x86_64-linux-gnu/pmix2
for path in /usr/bin/orterun /usr/bin/orted "$plugins" /usr/share/openmpi "$pmix/lib/libpmix.so.2" "$pmix/lib/pmix"; do
  [ -e "$path" ] || { echo "make_carry: $path is missing (scripts/setup.sh installs Open MPI)" >&2; exit 1; }
done
mkdir -p "$mpi/bin" "$mpi/lib/x86_64-linux-gnu/openmpi/lib" "$mpi/share" "$mpi/pmix/lib" "$mpi/pmix/share" "$mpi/libs"
cp /usr/bin/orterun /usr/bin/orted "$mpi/bin/"
ln -s orterun "$mpi/bin/mpirun"
cp -a "$plugins" "$mpi/lib/x86_64-linux-gnu/openmpi/lib/"
cp -a /usr/share/openmpi "$mpi/share/"
cp -L "$pmix/lib/libpmix.so.2" "$mpi/pmix/lib/"
cp -a "$pmix/lib/pmix" "$mpi/pmix/lib/"
cp -a "$pmix/share/pmix" "$mpi/pmix/share/"
# What the plugins and PMIx link beyond glibc and the binary's lib/ (UCX, libfabric, verbs and PSM are left out:
# the components that need them stay unloaded).
cp -L /usr/lib/x86_64-linux-gnu/libmca_common_{sm,ompio,monitoring}.so.[0-9][0-9] \
  /usr/lib/x86_64-linux-gnu/libmunge.so.2 /usr/lib/x86_64-linux-gnu/libnuma.so.1 "$mpi/libs/"
git rev-parse --short HEAD >"$carry/apps/beamline/COMMIT"
if ! git diff --quiet HEAD -- src apps tests; then echo "+uncommitted" >>"$carry/apps/beamline/COMMIT"; fi

if [ $tests = 1 ]; then
  staging=$(mktemp -d)
  mkdir -p "$staging/tests"
  programs=$(find "$build/tests" -maxdepth 1 -type f -name 'test_*' -perm -u+x | sort)
  [ -n "$programs" ] || { echo "make_carry: no test programs in $build/tests" >&2; exit 1; }
  for program in $programs; do strip -o "$staging/tests/$(basename "$program")" "$program"; done
  tar -C "$staging" -cf - tests | xz -9e -T0 >"$carry/tests.tar.xz"
  rm -rf "$staging"
  if [ -s "$build/testdata/o200k_base.tiktoken" ]; then
    mkdir -p "$carry/testdata"
    cp "$build/testdata/o200k_base.tiktoken" "$carry/testdata/"
  fi
  # From CTest's list: the harness's entries (name and arguments, one a line, for gpu_ctest.sh to run as CTest
  # would) and the entries whose program is neither a gtest executable nor the harness (not carried).
  ctest --test-dir "$build" --show-only=json-v1 | python3 -c '
import json, os, sys
harness, other = open(sys.argv[1], "w"), open(sys.argv[2], "w")
for test in json.load(sys.stdin)["tests"]:
    command = test.get("command", [""])
    program = os.path.basename(command[0])
    if program == "backend_ops":
        print(test["name"], *command[1:], sep="\t", file=harness)
    elif not program.startswith("test_"):
        print(test["name"], file=other)' "$carry/tests/HARNESS_TESTS" "$carry/tests/NOT_CARRIED"
fi
tar -C "$carry" -cf - apps tests $([ -d "$carry/testdata" ] && echo testdata) |
  xz -9e -T0 >"$carry/programs.tar.xz"
rm -rf "$carry/apps" "$carry/tests" "$carry/testdata"
du -sh "$carry"
