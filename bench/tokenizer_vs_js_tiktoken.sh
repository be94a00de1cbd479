#!/usr/bin/env bash
# o200k_base encode throughput of beamline against js-tiktoken, in the same run, on the same generated
# English prose, code and CJK texts (tests/js/tokenizer_bench_texts.mjs, ~2 MB each), both pinned to one
# core. Figures are MB per CPU-second (Google Benchmark's default for beamline, process.cpuUsage() for
# node), so a busy machine slows neither side. Writes bench/results/YYYY-MM-DD-tokenizer.md.
# Usage: bench/tokenizer_vs_js_tiktoken.sh [BUILD_DIR]   (default: build; configured already)
# BENCH_TOKENIZER=path runs that bench_tokenizer binary instead of building BUILD_DIR's.
set -euo pipefail
load_at_start="$(cut -d' ' -f1-3 /proc/loadavg)"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
js="$root/tests/js"
work="$build/tokenizer_bench"
[ -d "$js/node_modules/js-tiktoken" ] || { echo "tests/js/node_modules is missing: run scripts/setup.sh" >&2; exit 1; }
bench_exe="${BENCH_TOKENIZER:-}"
if [ -z "$bench_exe" ]; then
  cmake --build "$build" --target bench_tokenizer >/dev/null
  bench_exe="$build/bench/bench_tokenizer"
fi
mkdir -p "$work"
[ -s "$work/o200k_base.tiktoken" ] || node "$js/export_o200k.mjs" "$work/o200k_base.tiktoken"
node "$js/tokenizer_bench_texts.mjs" "$work/texts" 2
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)

texts=("$work/texts/english.txt" "$work/texts/code.txt" "$work/texts/cjk.txt")
(cd "$js" && "${pin[@]}" node bench_js_tiktoken.mjs "${texts[@]}") > "$work/js_tiktoken.jsonl"
BEAMLINE_TIKTOKEN_RANKS="$work/o200k_base.tiktoken" BEAMLINE_TOKENIZER_TEXTS="$work/texts" \
  "${pin[@]}" "$bench_exe" --benchmark_filter='encode|load' --benchmark_format=json \
  > "$work/beamline.json"

date="$(date -u +%F)"
command_line="${BENCH_TOKENIZER:+BENCH_TOKENIZER=$BENCH_TOKENIZER }bench/tokenizer_vs_js_tiktoken.sh $*"
result="$root/bench/results/$date-tokenizer.md"
mkdir -p "$root/bench/results"
node - "$work/beamline.json" "$work/js_tiktoken.jsonl" > "$result" <<NODE
const fs = require("fs");
const [ours, theirs] = process.argv.slice(2);
const beamline = JSON.parse(fs.readFileSync(ours, "utf8"));
const js = Object.fromEntries(fs.readFileSync(theirs, "utf8").trim().split("\n").map((l) => JSON.parse(l)).map((r) => [r.name, r]));
const rows = [];
for (const b of beamline.benchmarks.filter((b) => b.name.startsWith("encode/"))) {
  const name = b.name.split("/")[1], ours = b.bytes_per_second / 1e6, theirs = js[name].mb_per_s;
  if (b.tokens !== js[name].tokens) throw new Error(name + ": token counts differ: " + b.tokens + " vs " + js[name].tokens);
  rows.push("| " + name + " | " + (b.bytes / 1e6).toFixed(2) + " | " + b.tokens + " | " + ours.toFixed(1) + " | " +
            theirs.toFixed(2) + " | " + (ours / theirs).toFixed(0) + "x |");
}
const load = beamline.benchmarks.find((b) => b.name.startsWith("load"));
console.log([
  "# Tokenizer: beamline vs js-tiktoken (o200k_base encode), $date",
  "",
  "- Machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, load average $load_at_start at the start",
  "- Commit: $(git -C "$root" rev-parse --short HEAD), js-tiktoken $(node -p "require('$js/node_modules/js-tiktoken/package.json').version"), node $(node --version)",
  "- Command: \`$command_line\` (both pinned to one core; MB per CPU-second; same texts, same run; identical token counts checked)",
  "",
  "| text | MB | tokens | beamline MB/s | js-tiktoken MB/s | ratio |",
  "| --- | --- | --- | --- | --- | --- |",
  ...rows,
  "",
  "Loading the o200k_base rank file: " + (load.cpu_time).toFixed(0) + " ms CPU.",
].join("\n"));
NODE
cat "$result"
