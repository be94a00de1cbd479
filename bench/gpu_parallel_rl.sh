#!/usr/bin/env bash
# Weight sync and routing replay of a distributed server on two GPUs (docs/rl.md#weight-updates-of-a-distributed-model),
# one device call on nvidia-h200-x2: for TP2, PP2, DP2 and DP2 x EP (--dtype float32; the data-parallel servers with
# least-loaded routing, so that requests reach both replicas), tools/reference/check_weight_sync.py (a
# trainer's updates over tcp into the distributed server: every refusal leaves the old answers, then greedy tokens and
# logprobs equal a fresh distributed server's exactly) and tools/reference/check_routed_experts.py (every routed id of
# concurrent, batched and streamed requests equals the NumPy reference's routing of the same tokens). Then issue 20's
# rollout loop with the trainer's weights broadcast over NCCL: `WEIGHT_SYNC=nccl ROUNDS=3 bench/gpu_rollout.sh`, the
# PyTorch trainer on the second GPU, a float32 and a bfloat16 server on the first, checks (a)-(d) every round.
# Usage: bench/gpu_parallel_rl.sh CARRY_DIR [STEPS]   (CARRY_DIR from bench/make_carry.sh). STEPS, comma-separated
#        (default checks,rollout): checks (the eight above), rollout (the NCCL rollout loop; its tables and files in
#        $OUT as gpu_rollout.sh writes them; LIMIT_S bounds it, default 560 s: give it a device call of its own when
#        the checks take long). DEVICE=cpu: the checks on the cpu backend (ranks as processes; what CTest's
#        weight_sync_tcp_{tp2,dp2} and routed_experts_vs_reference_{tp2,pp2,dp2,dp2_ep2} run); the rollout step is
#        skipped there (NCCL). PYTHON: an interpreter with numpy (python3; with PyTorch for the rollout). Exit status
#        0 only when every check of the steps run passes.
set -uo pipefail
CARRY=$(realpath "${1:?usage: bench/gpu_parallel_rl.sh CARRY_DIR [STEPS]}")
STEPS=,${2:-checks,rollout},
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
layouts=("--tensor-parallel-size 2" "--pipeline-parallel-size 2"
         "--data-parallel-size 2 --data-parallel-routing least-loaded"
         "--data-parallel-size 2 --enable-expert-parallel --data-parallel-routing least-loaded")
[[ $STEPS == *,checks,* ]] || layouts=()
for layout in "${layouts[@]}"; do
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
if [[ $STEPS == *,rollout,* ]]; then
  if [ "$DEVICE" = cuda ]; then
    start=$SECONDS
    if WEIGHT_SYNC=nccl ROUNDS=3 PYTHON=$PYTHON bench/gpu_rollout.sh "$CARRY"; then
      echo "pass: rollout loop over NCCL, 3 rounds ($((SECONDS - start)) s)"
    else
      echo "FAIL: rollout loop over NCCL, 3 rounds ($((SECONDS - start)) s); the tables and the log's end are above"
      status=1
    fi
  else
    echo "skipped: rollout loop over NCCL (the trainer and the servers are NCCL ranks on two GPUs; DEVICE=cpu)"
  fi
fi
exit $status
