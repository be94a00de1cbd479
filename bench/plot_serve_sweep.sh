#!/usr/bin/env bash
# Draws a `beamline bench serve --max-concurrency 1,2,4,... --save-result` sweep table (*-sweep-*.tsv) as two PNGs
# next to it, with Debian's gnuplot (apt-get install gnuplot-nox):
#   <table>-throughput-latency.png  output tok/s against mean TPOT (each point a concurrency level, labelled)
#   <table>-ttft.png                mean and median TTFT against the concurrency (log2 axis)
# Usage: bench/plot_serve_sweep.sh TABLE.tsv [TITLE]
set -euo pipefail
table=${1:?usage: plot_serve_sweep.sh TABLE.tsv [TITLE]}
title=${2:-$(basename "$table" .tsv)}
command -v gnuplot > /dev/null || { echo "gnuplot is missing: apt-get install gnuplot-nox" >&2; exit 1; }
[ -s "$table" ] || { echo "$table: missing or empty" >&2; exit 1; }
# The columns by name, so the table's layout (format_sweep_table in src/loadgen/serve_metrics.cpp) is read, not assumed.
column() { head -1 "$table" | tr '\t' '\n' | grep -nx "$1" | cut -d: -f1; }
c_level=$(column max_concurrency)
c_output=$(column output_throughput)
c_tpot=$(column mean_tpot_ms)
c_ttft=$(column mean_ttft_ms)
c_ttft_median=$(column median_ttft_ms)
for c in "$c_level" "$c_output" "$c_tpot" "$c_ttft" "$c_ttft_median"; do
  [ -n "$c" ] || { echo "$table: not a sweep table (a column is missing)" >&2; exit 1; }
done
base=${table%.tsv}
gnuplot <<GNUPLOT
set terminal pngcairo size 900,600 noenhanced
set datafile separator "\t"
set key bottom right
set grid
set output "${base}-throughput-latency.png"
set title "${title}: throughput against latency"
set xlabel "mean time per output token (ms)"
set ylabel "output tokens / s"
plot "${table}" skip 1 using ${c_tpot}:${c_output} with linespoints pt 7 title "output throughput", \
     "" skip 1 using ${c_tpot}:${c_output}:(sprintf("c=%s", strcol(${c_level}))) with labels offset 1,1 notitle
set output "${base}-ttft.png"
set title "${title}: time to first token"
set xlabel "max concurrency"
set ylabel "TTFT (ms)"
set logscale x 2
plot "${table}" skip 1 using ${c_level}:${c_ttft} with linespoints pt 7 title "mean", \
     "" skip 1 using ${c_level}:${c_ttft_median} with linespoints pt 5 title "median"
GNUPLOT
echo "${base}-throughput-latency.png ${base}-ttft.png"
