#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang under ASan and UBSan (build-fuzz/, CPU only, apart from the
# g++ build) and runs each for SECONDS (default 600), one at a time at the lowest priority, starting from its
# committed seed corpus. Writes bench/results/<date>-fuzz.md: per target the executions, the coverage and the
# crashes, with the command. Crash inputs are kept in build-fuzz/findings/<target>/; a finding, once fixed, goes into
# tests/fuzz/corpus/<target>/ so the normal build's CTest replays it.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets without the fuzz_ prefix; all when none are given;
# FUZZ_RECORD=path writes the record elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
arguments="$*"
seconds=${1:-600}
shift || true
build=build-fuzz
command -v clang++ >/dev/null || { echo "scripts/fuzz.sh: clang++ not found (scripts/setup.sh installs clang)" >&2; exit 1; }
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DBEAMLINE_FUZZ=ON -DBEAMLINE_CUDA=OFF -DBEAMLINE_TESTS=OFF >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for source in tests/fuzz/fuzz_*.cpp; do name=$(basename "$source" .cpp); targets+=("${name#fuzz_}"); done
fi
nice -n 19 cmake --build "$build" -j"${FUZZ_BUILD_JOBS:-2}" --target "${targets[@]/#/fuzz_}"

# The loaders under test read their input from a file: in memory (/dev/shm) that is ~10x the executions of a disk.
TMPDIR=$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )/beamline-fuzz.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

record=${FUZZ_RECORD:-bench/results/$(date -u +%F)-fuzz.md}
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests/fuzz || echo "+changes")
{
  echo "# Fuzzing (libFuzzer, ASan + UBSan), $(date -u '+%F %H:%M UTC')"
  echo
  echo "Machine: $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), shared;" \
       "$(clang++ --version | head -1). Commit $commit. Command: \`scripts/fuzz.sh${arguments:+ $arguments}\`" \
       "(each target alone in one process, \`nice -n 19\`, \`-max_total_time=$seconds\`, \`-rss_limit_mb=2048\`)."
  echo
  echo "| target | seconds | executions | exec/s | coverage (edges) | features | corpus (files) | crashes |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
} > "$record"
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target   # the grown corpus; the committed seeds are read, never written
  findings=$build/findings/$target
  rm -rf "$findings"   # this run's findings only (one that was fixed is in the seed corpus by now)
  mkdir -p "$corpus" "$findings"
  log=$build/fuzz-$target.log
  start=$(date +%s)
  status=0
  # One process per target, one target at a time (libFuzzer's -jobs would fork workers that log to fuzz-N.log).
  nice -n 19 "$build/tests/fuzz/fuzz_$target" "$corpus" "tests/fuzz/corpus/$target" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 -artifact_prefix="$findings/" \
    >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - start ))
  executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  coverage=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  features=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  files=$(find "$corpus" -type f | wc -l)
  crashes=$(find "$findings" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  rate=$([ "$executions" != "?" ] && [ "$elapsed" -gt 0 ] && echo $(( executions / elapsed )) || echo "?")
  echo "| $target | $elapsed | $executions | $rate | $coverage | $features | $files | $crashes |" >> "$record"
  if [ "$status" -ne 0 ]; then
    echo "fuzz_$target stopped with status $status (log: $log):" >&2
    grep -E 'ERROR|SUMMARY|terminate|what\(\)' "$log" | head -5 >&2 || true
  fi
done
echo >> "$record"
echo "Crash inputs (if any) are in $build/findings/<target>/; logs in $build/fuzz-<target>.log." >> "$record"
cat "$record"
