#!/usr/bin/env bash
# o200k ids from `beamline tokenize` against js-tiktoken's on the corpus of tests/js/tokenizer_corpus.mjs.
# The o200k rank file is rebuilt from the npm package (never committed). Exits 77 (CTest: skipped) only
# when the npm packages are not installed; scripts/setup.sh installs them, so CI always runs it.
# Usage: tokenizer_vs_js_tiktoken.sh BEAMLINE_EXE WORK_DIR
set -euo pipefail
beamline="$1"
work="$2"
js="$(cd "$(dirname "$0")/../js" && pwd)"
if [ ! -d "$js/node_modules/js-tiktoken" ]; then
  echo "SKIPPED: $js/node_modules/js-tiktoken is missing; run scripts/setup.sh (npm install in tests/js)"
  exit 77
fi
mkdir -p "$work"
ranks="$work/o200k_base.tiktoken"
[ -s "$ranks" ] || node "$js/export_o200k.mjs" "$ranks"
cd "$js"
node compare_tokenizer.mjs "$beamline" "$ranks" "$work"
