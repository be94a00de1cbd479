#pragma once
// The sandwich norm after a row-parallel block of a tensor-parallel layer (after o_proj, after the MLP or MoE;
// docs/parallel.md, "Fused all-reduce + residual add + RMSNorm"): the ranks' partial outputs summed over the group,
// then add_rms_norm (and the next sub-layer's input norm). Two paths, the same math:
//   fused    each rank writes its partial into memory the peers map (backend/peer_all_reduce.h) and one kernel
//            sums the ranks' rows and norms them (CUDA: one-shot over NVLink, backend/cuda/rows/all_reduce_norm.h);
//   unfused  the group's all_reduce_sum (NCCL on CUDA, MPI on the CPU), then Backend::add_rms_norm(_then_norm).
// This class decides (fused()) and runs the fused path; the model runs the unfused one (model/beam_model.cpp).
// The fused path takes decode-size messages, up to kFusedAllReduceMaxBytes; larger ones, the CPU backend, and runs
// whose ranks cannot map each other's memory take the unfused path.
//
// BEAMLINE_FUSED_ALLREDUCE_NORM picks a path (every rank must see the same value):
//   never   (default) the all-reduce and the separate norm only (as vLLM's --disable-custom-all-reduce for its own
//           kernel): the fused path is opt-in until it has run across GPUs; its two-processes-on-one-GPU test traps
//           on the H200 (bench/results/2026-12-03-session9-final.md)
//   auto    fused up to kFusedAllReduceMaxBytes
//   always  fused whenever the kernel can: up to PeerAllReduce::max_rows() rows of at most max_hidden() values
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "backend/peer_all_reduce.h"
#include "parallel/communicator.h"

namespace beamline {

// The largest message (rows x hidden x 4 bytes) the fused path takes under `auto`: 64 rows of Beam's 5,120, the
// largest size measured. Measured on one H200 only, the N partials as local buffers (bench/results/
// 2026-12-03-session8-start.md, "Fused all-reduce + norm"): the fused kernel took 0.83-0.97x the time of a sum kernel
// plus the separate norm at 2 and 4 ranks from 1 to 64 rows (0.90-1.11x at 8 ranks), all launch-bound; across GPUs it
// also replaces NCCL's launch. Not yet measured across GPUs: bench/gpu_tp_fused.sh times the TP2 decode step both
// ways on two H200s; set this from that table.
constexpr int64_t kFusedAllReduceMaxBytes = int64_t{64} * 5120 * 4;

enum class FusedAllReduceMode : int32_t { Auto = 0, Always = 1, Never = 2 };
// BEAMLINE_FUSED_ALLREDUCE_NORM (never when unset or empty); an Error naming the variable for another value.
FusedAllReduceMode fused_all_reduce_mode();

class FusedAllReduceNorm {
 public:
  // Collective over `group` (the tensor-parallel group; it and `backend` must outlive this): with a backend that has
  // peer memory and a mode other than never, every rank makes its memory, the ranks exchange handles and map each
  // other's; if any rank cannot, every rank takes the unfused path (each logs why). The CPU backend: no collective.
  FusedAllReduceNorm(Communicator& group, Backend& backend);
  ~FusedAllReduceNorm();

  // Whether a block of `rows` x `hidden` takes the fused path: the same answer on every rank of the group.
  bool fused(int64_t rows, int64_t hidden) const;
  // This rank's partial [rows, hidden] in the mapped memory (when fused(rows, hidden)): where the block writes.
  Tensor partial(int64_t rows, int64_t hidden);
  // residual += scale * rms(the group's sum of partial(rows, hidden), weight), rows and hidden residual's; with
  // next_weight defined, then out = rms(residual, next_weight). Every rank of the group, in the same order.
  void add_rms_norm(Tensor& residual, const Tensor& weight, float eps, float scale, const Tensor& next_weight,
                    Tensor& out);

 private:
  Communicator& group_;
  FusedAllReduceMode mode_ = FusedAllReduceMode::Never;
  std::unique_ptr<PeerAllReduce> peers_;  // null: unfused only
  int64_t calls_ = 0, rows_ = 0;          // fused launches and their rows, logged at the end
};

}  // namespace beamline
