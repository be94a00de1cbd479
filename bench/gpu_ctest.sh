#!/usr/bin/env bash
# The CTest suite's test programs on the GPU machine, in one call, with the GPU visible. CTest's own files name this
# build's absolute paths, which do not exist there, so the programs that `bench/make_carry.sh --tests` packed run
# directly: every gtest executable with --gtest_output=xml (in parallel), and the op harness's CTest entries
# (backend_ops test --small, cpu and cuda; 77 = skipped, as CTest's SKIP_RETURN_CODE). BEAMLINE_REQUIRE_CUDA=1 (the default here) makes a CUDA instance that
# cannot start a failure instead of a skip: a device test that skips on the machine it exists for has not run.
# Usage: bench/gpu_ctest.sh CARRY_DIR   (from the repository root: the tests read their data from it)
#        JOBS (default 8) programs at a time; TEST_TIMEOUT (default 240) seconds each.
# Writes $OUT/gpu_ctest.md (date, GPU, commit, per-program counts, every failure and skip with its message) and
# $OUT/ctest/<program>.{log,xml}. Last line: "N passed, M failed, K skipped"; exit 1 when a test failed or a
# program did not run to its end.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_ctest.sh CARRY_DIR}
CARRY=$(cd "$CARRY" && pwd)
OUT=${OUT:-$(mktemp -d)}
source "$(dirname "$0")/open_carry.sh"
# The test programs link the Debian libraries that beamline carries (cpp-httplib, Open MPI); the GPU machine lacks them.
export LD_LIBRARY_PATH="$CARRY/apps/beamline/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BEAMLINE_REQUIRE_CUDA=${BEAMLINE_REQUIRE_CUDA:-1}
export BEAMLINE_SOURCE_DIR=$PWD BEAMLINE_EXE=$CARRY/apps/beamline/beamline
[ ! -s "$CARRY/testdata/o200k_base.tiktoken" ] || export BEAMLINE_O200K_RANKS=$CARRY/testdata/o200k_base.tiktoken
BIN=$BEAMLINE_EXE source "$(dirname "$0")/cuda_env.sh"
mkdir -p "$OUT/ctest"
TESTS=$(mktemp -d)
tar -xJf "$CARRY/tests.tar.xz" -C "$TESTS" || { echo "gpu_ctest: cannot unpack $CARRY/tests.tar.xz" >&2; exit 1; }

# One program: its log, its XML, and its exit status in <name>.status (NAME defaults to the program's).
run_one() {
  local program=$1 name=${2:-$(basename "$1")}
  timeout "${TEST_TIMEOUT:-240}" "$program" --gtest_output="xml:$OUT/ctest/$name.xml" >"$OUT/ctest/$name.log" 2>&1
  echo $? >"$OUT/ctest/$name.status"
}
export -f run_one
export OUT TEST_TIMEOUT
start=$SECONDS
find "$TESTS/tests" -maxdepth 1 -type f -name 'test_*' -perm -u+x | sort |
  xargs -P "${JOBS:-8}" -I{} bash -c 'run_one {}'
# The harness's own CTest entries, with the arguments CTest gives them (tests/backend_ops/CMakeLists.txt).
while IFS=$'\t' read -r name arguments; do
  # shellcheck disable=SC2086  # the arguments are CTest's, split as it splits them (none holds a space)
  timeout "${TEST_TIMEOUT:-240}" "$CARRY/tests/backend_ops/backend_ops" $arguments >"$OUT/ctest/$name.log" 2>&1
  echo $? >"$OUT/ctest/$name.status"
done <"$CARRY/tests/HARNESS_TESTS"
# Two processes' kernels share one GPU side by side only under MPS: the first run of test_peer_all_reduce checked
# that its ranks refuse to share the GPU without it; under MPS (where the machine has it) the same test must compute.
mps=$(command -v nvidia-cuda-mps-control || true)
if [ -n "$mps" ] && [ -x "$TESTS/tests/test_peer_all_reduce" ]; then
  (
    export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY BEAMLINE_EXPECT_MPS=1
    CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
    "$mps" -d && run_one "$TESTS/tests/test_peer_all_reduce" test_peer_all_reduce_under_mps
    echo quit | "$mps"
  )
fi
elapsed=$((SECONDS - start))

python3 - "$OUT/ctest" "$CARRY" "$elapsed" >"$OUT/gpu_ctest.md" <<'PY'
import os, subprocess, sys, xml.etree.ElementTree as ET

folder, carry, elapsed = sys.argv[1], sys.argv[2], sys.argv[3]
def text(path, default=""):
    try:
        return open(path).read().strip()
    except OSError:
        return default
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
except OSError:  # no nvidia-smi: no GPU here
    gpu = []
print("# CTest suite on the GPU machine\n")
print("| | |\n| --- | --- |")
print(f"| date | {subprocess.run(['date', '-u', '+%Y-%m-%d %H:%M UTC'], capture_output=True, text=True).stdout.strip()} |")
print(f"| GPU | {gpu[0] if gpu else 'none found'} |")
print(f"| commit | {text(os.path.join(carry, 'apps/beamline/COMMIT'), 'unknown').replace(chr(10), ' ')} |")
print(f"| command | `BEAMLINE_REQUIRE_CUDA={os.environ.get('BEAMLINE_REQUIRE_CUDA', '')} bench/gpu_ctest.sh` ({elapsed} s) |")
not_carried = text(os.path.join(carry, "tests/NOT_CARRIED"))
if not_carried:
    print(f"| not carried | {not_carried.replace(chr(10), ', ')} (host-side scripted tests: run by scripts/test.sh) |")
print("\n| program | passed | failed | skipped | exit |\n| --- | --- | --- | --- | --- |")
passed = failed = skipped = 0
notes = []
for name in sorted(f[:-len(".status")] for f in os.listdir(folder) if f.endswith(".status")):
    status = int(text(os.path.join(folder, name + ".status"), "-1"))
    p = f = s = 0
    xml_path = os.path.join(folder, name + ".xml")
    if name.startswith("backend_ops_"):  # the harness: one CTest entry, 77 = skipped
        p, f, s = int(status == 0), int(status not in (0, 77)), int(status == 77)
        if f or s:
            tail = text(os.path.join(folder, name + ".log")).splitlines()[-3:]
            notes.append(f"- {'FAILED' if f else 'skipped'} {name} (exit {status}): {' / '.join(tail)}")
    elif os.path.exists(xml_path):
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            full = f"{case.get('classname')}.{case.get('name')}"
            failure = case.find("failure")
            skip = case.find("skipped")
            if failure is not None:
                f += 1
                message = " / ".join(line.strip() for line in failure.get("message", "").splitlines() if line.strip())
                notes.append(f"- FAILED {name}: {full}: {message[:400]}")
            elif skip is not None or case.get("result") == "skipped":
                s += 1
                message = (skip.get("message", "") if skip is not None else "").strip().splitlines()
                notes.append(f"- skipped {name}: {full}: {message[-1][:300] if message else ''}")
            else:
                p += 1
    # A program that did not exit 0 (crash, timeout, no XML) failed even where its XML shows no failing test.
    if status != 0 and not name.startswith("backend_ops_") and f == 0:
        f += 1
        notes.append(f"- FAILED {name}: exit {status}" + (" (timeout)" if status == 124 else "") +
                     ("" if os.path.exists(xml_path) else ", no XML: it did not run to its end"))
    passed, failed, skipped = passed + p, failed + f, skipped + s
    print(f"| {name} | {p} | {f} | {s} | {status} |")
print("\n## Failures and skips\n")
print("\n".join(notes) if notes else "none")
print(f"\n{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
status=$?
rm -rf "$TESTS"
cat "$OUT/gpu_ctest.md"
exit $status
