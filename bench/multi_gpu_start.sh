# Sourced by the multi-GPU scripts (gpu_two.sh, gpu_eight.sh) from the repository root, with CARRY (absolute), STEPS
# (",a,b,"), NAME (the report's file name), TITLE, SMALL_NOTE (what SMALL=1 changes) and GPUS (how many the layouts
# need) set. Sets OUT, DEVICE (cuda, or cpu for the dry run), BIN, REPORT, LOG, INFO and WORK; sources the carry, the
# check rows (check_table.sh) and the steps (gpu_steps.sh); sets up MPI for one node and CUDA with NCCL; writes the
# report's header and opens its Checks table with the rows that everything else needs: mpirun, libnccl.so.2, the GPUs.
# Defines parallel_logits_rows, the logits check both scripts run.
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
BIN=$CARRY/apps/beamline/beamline
REPORT=$OUT/$NAME.md
LOG=$OUT/$NAME.log
: >"$LOG"
INFO=$(mktemp)
WORK=$(mktemp -d)
source bench/open_carry.sh
source bench/carried_mpi.sh
source bench/check_table.sh
source bench/gpu_steps.sh
# One node: MPI over shared memory (no single-copy mechanism: containers often forbid ptrace), as root if need be.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$DEVICE" = cuda ]; then
  source bench/cuda_env.sh
  # NVLink multicast stays off (the device machines' rule: it can take the host's GPUs out of service).
  export BEAMLINE_REQUIRE_CUDA=1 NCCL_NVLS_ENABLE=0
else
  export OMPI_MCA_mpi_yield_when_idle=1  # the ranks share the cores
fi

commit=$(cat "$CARRY/apps/beamline/COMMIT" 2>/dev/null | tr '\n' ' ')
[ -n "$commit" ] || commit="$(git rev-parse --short HEAD 2>/dev/null) (the working tree's: the binary carries no COMMIT)"
{
  echo "# $TITLE"
  echo
  echo "| | |"
  echo "| --- | --- |"
  echo "| date | $(date -u '+%Y-%m-%d %H:%M UTC') |"
  echo "| device | $DEVICE$([ "${SMALL:-0}" = 1 ] && echo ", SMALL=1 ($SMALL_NOTE: a dry run of the script, not a measurement)") |"
  echo "| GPUs | $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sort | uniq -c | tr '\n' ' ' || true) |"
  echo "| commit | $commit |"
  echo "| command | \`$([ "$DEVICE" = cpu ] && echo 'DEVICE=cpu ')$([ "${SMALL:-0}" = 1 ] && echo 'SMALL=1 ')bench/$NAME.sh CARRY_DIR ${STEPS:1:-1}\` |"
  echo "| host | $(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB, $(uname -r) |"
} >"$REPORT"
command -v nvidia-smi >/dev/null && logged nvidia-smi topo -m

section "Checks"
echo "| check | measured | limit | result |" >>"$REPORT"
echo "| --- | --- | --- | --- |" >>"$REPORT"
# The one-command form starts its ranks with `mpirun`: this machine's Open MPI 4, else the carried one
# (bench/carried_mpi.sh); NCCL is loaded at run time (cuda_env.sh finds libnccl.so.2).
mpirun_version=$(mpirun --version 2>/dev/null | head -1)
check_row "mpirun, $MPI_SOURCE (the one-command form starts its ranks with it)" "${mpirun_version:-absent}" \
  "Open MPI 4.x (the carried libmpi.so.40)" "$([[ $mpirun_version == *"Open MPI) 4."* ]] && echo 1 || echo 0)"
if [ "$DEVICE" = cuda ]; then
  nccl=$(python3 -c 'import ctypes; n = ctypes.c_int(); ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(n)); print(n.value)' 2>&1 | tail -1)
  check_row "libnccl.so.2 loads" "${nccl:0:120}" "a version number" "$([[ $nccl =~ ^[0-9]+$ ]] && echo 1 || echo 0)"
  visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  check_row "GPUs visible" "$visible" ">= $GPUS" "$([ "$visible" -ge "$GPUS" ] && echo 1 || echo 0)"
fi

# Logits rows: one process's logits of the model in the array model_args, then each "LABEL|FLAGS" layout's against
# them (float32 within 1e-5 relative, bfloat16 by argmax). Usage: parallel_logits_rows NAME TAG DTYPE TOKENS LAYOUT...
parallel_logits_rows() {
  local name=$1 tag=$2 dtype=$3 tokens=$4 layout label row mode
  shift 4
  local common=(--tokens "$tokens" --device "$DEVICE" --dtype "$dtype" --kv-cache-dtype "$dtype")
  logged timeout 180 "$BIN" logits "${model_args[@]}" "${common[@]}" --out "$WORK/$tag-one.npy"
  mode=$([ "$dtype" = float32 ] && echo parallel || echo parallel-bf16)
  for layout in "$@"; do
    label=${layout%%|*}
    # shellcheck disable=SC2206
    local parallel=(${layout#*|})
    logged timeout 180 "$BIN" logits "${model_args[@]}" "${common[@]}" --out "$WORK/$tag-$label.npy" "${parallel[@]}"
    row="logits $label vs TP1, $name, --dtype $dtype"
    checks_from "$row" 1 python3 bench/compare_logits.py "$mode" "$WORK/$tag-$label.npy" "$WORK/$tag-one.npy" "$row"
  done
}
