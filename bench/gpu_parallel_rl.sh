#!/usr/bin/env bash
# Weight sync and routing replay of a distributed server on two GPUs (docs/rl.md#weight-updates-of-a-distributed-model),
# one device call on nvidia-h200-x2: for TP2, PP2, DP2 and DP2 x EP (--dtype float32; the data-parallel servers with
# least-loaded routing, so that requests reach both replicas), tools/reference/check_weight_sync.py (a
# trainer's updates over tcp into the distributed server: every refusal leaves the old answers, then greedy tokens and
# logprobs equal a fresh distributed server's exactly) and tools/reference/check_routed_experts.py (every routed id of
# concurrent, batched and streamed requests equals the NumPy reference's routing of the same tokens).
# Usage: bench/gpu_parallel_rl.sh CARRY_DIR   (CARRY_DIR from bench/make_carry.sh). DEVICE=cpu: the same on the cpu
#        backend (ranks as processes; what CTest's weight_sync_tcp_{tp2,dp2} and
#        routed_experts_vs_reference_{tp2,pp2,dp2,dp2_ep2} run). PYTHON: an interpreter with numpy (python3). Exit status
#        0 only when all eight checks pass.
set -uo pipefail
CARRY=$(realpath "${1:?usage: bench/gpu_parallel_rl.sh CARRY_DIR}")
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # with numpy
source bench/open_carry.sh
BIN=$CARRY/apps/beamline/beamline
[ -x "$BIN" ] || { echo "gpu_parallel_rl: $BIN is not there" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$DEVICE" = cuda ]; then
  source bench/cuda_env.sh
  export BEAMLINE_REQUIRE_CUDA=1 NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (the device machines' rule)
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
else
  export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
echo "commit $(cat "$CARRY/apps/beamline/COMMIT" 2>/dev/null || git rev-parse --short HEAD), device $DEVICE"
status=0
for layout in "--tensor-parallel-size 2" "--pipeline-parallel-size 2" \
    "--data-parallel-size 2 --data-parallel-routing least-loaded" \
    "--data-parallel-size 2 --enable-expert-parallel --data-parallel-routing least-loaded"; do
  for check in check_weight_sync check_routed_experts; do
    start=$SECONDS
    if "$PYTHON" "tools/reference/$check.py" --beamline "$BIN" --device "$DEVICE" --extra-args "$layout --dtype float32" \
        >"/tmp/gpu_parallel_rl.$check.log" 2>&1; then
      echo "pass: $check $layout ($((SECONDS - start)) s): $(tail -1 "/tmp/gpu_parallel_rl.$check.log")"
    else
      echo "FAIL: $check $layout ($((SECONDS - start)) s); the log's end:"
      tail -20 "/tmp/gpu_parallel_rl.$check.log"
      status=1
    fi
  done
done
exit $status
