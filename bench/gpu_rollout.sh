#!/usr/bin/env bash
# Issue 20's rollout loop in one device call: bench/rollout_loop.py as the PyTorch trainer of beam-nano
# (models/beam-nano, in the working tree) drives a float32 and a bfloat16 `beamline serve`, pushing new weights
# each round over the weight-sync protocol (backend tcp; WEIGHT_SYNC=nccl: NCCL broadcasts from the trainer's GPU,
# on two GPUs), and checks
# (a) bit-identical logprobs against a fresh server on the trainer's checkpoint, (b) logprobs within 1e-4 of the
# PyTorch reference, (c) routed experts equal to the reference's, (d) the routing-replay logprob gap in bfloat16.
# Usage: bench/gpu_rollout.sh CARRY_DIR   (CARRY_DIR from bench/make_carry.sh, or a build folder with
#        apps/beamline/beamline). DEVICE=cpu runs it on the cpu backend (smaller defaults). ROUNDS, ROLLOUTS,
#        REPLAY_ROLLOUTS, MAX_TOKENS override the sizes; PYTHON the interpreter with torch and numpy (python3);
#        REPLAY_QUANTIZATION=mxfp8 (or fp8, nvfp4) serves the bfloat16 server's weights quantized, each update
#        quantized on arrival (MXFP8 rollouts with routing replay). WEIGHT_SYNC=nccl (default tcp; kind
#        nvidia-h200-x2): the trainer's tensors on the second GPU (cuda:1) broadcast over NCCL into the servers on the
#        first (a group per server: NCCL refuses two ranks on one GPU); refused, saying so, with fewer than two GPUs.
#        LIMIT_S bounds the loop's seconds (default 560 on cuda, inside one device call; 3600 on the cpu backend,
#        where a round takes minutes on a loaded 2-core VM); at the limit it stops and reports the rounds done so far.
#        Writes $OUT/rollout.log, $OUT/rollout.md, $OUT/rollout.json; prints the tables; exits non-zero when a
#        check fails or does not run.
set -uo pipefail
CARRY=${1:?usage: bench/gpu_rollout.sh CARRY_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
WEIGHT_SYNC=${WEIGHT_SYNC:-tcp}
case $WEIGHT_SYNC in
  tcp) ;;
  nccl)
    [ "$DEVICE" = cuda ] || {
      echo "gpu_rollout: WEIGHT_SYNC=nccl runs on cuda (the servers are NCCL ranks)" >&2; exit 1; }
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    [ "$gpus" -ge 2 ] || {
      echo "gpu_rollout: WEIGHT_SYNC=nccl needs two GPUs (nvidia-h200-x2): NCCL refuses two ranks on one GPU, so" \
        "the trainer cannot share the servers'; this machine has $gpus" >&2; exit 1; }
    # NVLink multicast stays off (the device machines' rule); NCCL's warnings go to the log.
    export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN} ;;
  *) echo "gpu_rollout: WEIGHT_SYNC=$WEIGHT_SYNC is not tcp or nccl" >&2; exit 1 ;;
esac
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
LOG=$OUT/rollout.log
source bench/open_carry.sh
BIN=$(cd "$CARRY" && pwd)/apps/beamline/beamline
[ -x "$BIN" ] || { echo "gpu_rollout: $BIN is not there" >&2; exit 1; }
if [ "$DEVICE" = cuda ]; then
  source bench/cuda_env.sh
  sizes=(--rounds "${ROUNDS:-3}" --rollouts "${ROLLOUTS:-16}" --replay-rollouts "${REPLAY_ROLLOUTS:-64}"
         --max-tokens "${MAX_TOKENS:-128}" --kv-cache-memory 2G --reference-batch 16)
else
  sizes=(--rounds "${ROUNDS:-2}" --rollouts "${ROLLOUTS:-4}" --replay-rollouts "${REPLAY_ROLLOUTS:-8}"
         --max-tokens "${MAX_TOKENS:-32}" --max-prompt-tokens 300)
fi
built="of the build folder"
[ -s "$CARRY/apps/beamline/COMMIT" ] && built="built at $(tr '\n' ' ' <"$CARRY/apps/beamline/COMMIT")"
{
  date -u '+%Y-%m-%d %H:%M UTC'
  echo "binary $built; scripts at $(git rev-parse --short HEAD)"
  if [ "$DEVICE" = cuda ]; then nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; fi
  echo "$(nproc) CPU cores; weight sync $WEIGHT_SYNC"
  "$PYTHON" -c 'import torch, numpy
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "numpy", numpy.__version__)'
} 2>&1 | tee "$LOG"
start=$SECONDS
quantized=()
[ -n "${REPLAY_QUANTIZATION:-}" ] && quantized=(--replay-quantization "$REPLAY_QUANTIZATION")
limit=${LIMIT_S:-560}
[ "$DEVICE" = cuda ] || limit=${LIMIT_S:-3600}
timeout "$limit" "$PYTHON" bench/rollout_loop.py --beamline "$BIN" --device "$DEVICE" --out "$OUT" "${sizes[@]}" \
  "${quantized[@]}" --weight-sync "$WEIGHT_SYNC" >>"$LOG" 2>&1
status=$?
echo "rollout_loop.py exit $status in $((SECONDS - start)) s"
if [ -s "$OUT/rollout.md" ]; then
  cat "$OUT/rollout.md"
else
  echo "no result table: the loop did not finish; the log's end:"
  tail -40 "$LOG"
fi
[ $status = 0 ] && [ -s "$OUT/rollout.md" ]
