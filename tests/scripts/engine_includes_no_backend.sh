#!/usr/bin/env bash
# EngineCore and the scheduler never see a device (the model runner owns a step's device work): no backend header
# reaches src/engine/engine_core.* or src/engine/scheduler.*, directly or through any beamline header they include.
# Follows the quoted includes under <src dir>; prints the include chain to every backend header it finds.
set -euo pipefail
src=${1:?usage: engine_includes_no_backend.sh <src dir>}
declare -A seen
found=0

visit() {  # <file under src> <include chain that reached it>
  local file=$1 chain=$2 include
  [[ -z ${seen[$file]:-} ]] || return 0
  seen[$file]=1
  while read -r include; do
    if [[ $include == backend/* ]]; then
      echo "$chain -> $include"
      found=1
    elif [[ -f $src/$include ]]; then
      visit "$include" "$chain -> $include"
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$src/$file")
}

for file in engine/engine_core.h engine/engine_core.cpp engine/scheduler.h engine/scheduler.cpp; do
  [[ -f $src/$file ]] || { echo "missing $src/$file"; exit 1; }
  visit "$file" "$file"
done
if ((found)); then
  echo "EngineCore and the scheduler must not include backend headers (engine/model_runner.h is their contract)"
  exit 1
fi
echo "no backend header in the ${#seen[@]} headers and sources EngineCore and the scheduler include"
