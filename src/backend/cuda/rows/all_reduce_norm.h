#pragma once
// The tensor-parallel all-reduce fused with the sandwich norm (Backend::all_reduce_add_rms_norm), one-shot over peer
// buffers (all_reduce_norm.cu): every rank reads every rank's partial rows over NVLink, sums them in rank order and
// adds the normalized sum into its residual, in one kernel (no NVLink multicast). docs/parallel.md, "Fused all-reduce
// + norm", says where it stands against NCCL.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace beamline::cuda {

constexpr int kAllReduceMaxRanks = 8;    // = kMaxAllReduceRanks (backend.h; checked in cuda_backend.cpp)
// The most rows of a launch with the handshake (a block per row, all resident at once): decode-size messages; larger
// ones take NCCL's all-reduce and the separate norm.
constexpr int kAllReduceMaxRows = 64;
constexpr int64_t kAllReduceMaxHidden = 8192;  // the widest row it holds in registers (norm_row.cuh)

// One rank's handshake memory, in device memory its peers can write (cudaMalloc'd, opened by the peers through a
// cudaIpcMemHandle), zeroed once before the first launch. start/end[b][p]: the epoch at which rank p's block b last
// arrived; epoch[b]: this rank's block b's launch count, kept on the device so that a recorded graph replays it.
struct AllReduceSignal {
  uint32_t start[kAllReduceMaxRows][kAllReduceMaxRanks];
  uint32_t end[kAllReduceMaxRows][kAllReduceMaxRanks];
  uint32_t epoch[kAllReduceMaxRows];
};

// The group as one rank sees it: every rank's partial [rows, hidden] F32 and handshake memory at their addresses in
// this GPU's space (its own and its peers' IPC-mapped ones), indexed by rank. signal[0] null: no handshake, the
// partials are complete before the launch (buffers of one device, as in backend_ops).
// local_ranks: the ranks [rank, rank + local_ranks) in one launch on this device, their residuals (and outs) one after
// another: N GPUs' handshake checked on one (backend_ops), every rank's blocks resident at once; 1 on a TP run.
struct AllReducePeers {
  const float* partial[kAllReduceMaxRanks] = {};
  AllReduceSignal* signal[kAllReduceMaxRanks] = {};
  int32_t ranks = 0, rank = 0, local_ranks = 1;
};

// residual += scale * rms(sum of the partials in rank order, weight); next_weight non-null: also
// out = rms(residual, next_weight) (weights of one dtype). hidden <= kAllReduceMaxHidden; with the handshake,
// rows x local_ranks <= kAllReduceMaxRows. With a
// handshake, a peer that does not arrive within 10 s traps the kernel (cudaErrorLaunchFailure) rather than hang.
cudaError_t all_reduce_add_rms_norm(const AllReducePeers& peers, float* residual, const void* weight,
                                    const void* next_weight, DType weight_dtype, float eps, float scale, int64_t rows,
                                    int64_t hidden, float* out, cudaStream_t stream);
// out = the partials' sum in rank order, `count` values, no handshake: what an all-reduce leaves in each rank's
// buffer before the separate norm (the unfused path's local part, timed by backend_ops perf all_reduce_norm).
cudaError_t sum_partials(const AllReducePeers& peers, int64_t count, float* out, cudaStream_t stream);

}  // namespace beamline::cuda
