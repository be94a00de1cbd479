// The one-shot all-reduce fused with the sandwich norm (all_reduce_norm.h). A block per row: it reads the row of every
// rank's partial, sums them in rank order, adds the normalized sum into the residual and, for add_rms_norm_then_norm,
// normalizes the new residual, all with the row in registers (norm_row.cuh).
//
// The handshake, per block b of each rank, over the ranks' AllReduceSignal:
//   start: rank r stores epoch e into start[b][r] of every rank (its own included), then waits until its own
//          start[b][p] == e for every rank p. The partial a rank publishes was written by the kernels before this one
//          on its stream, so it is complete at this kernel's start; the store is a release at system scope
//          (cuda::atomic_ref, thread_scope_system) and the wait an acquire at system scope, so a peer that sees e also
//          sees that partial. __syncthreads then carries the acquire to the block's other threads, whose loads of peer
//          rows go through L2 (ld.global.cg): no L1 line of an earlier launch can serve them.
//   end:   after the block's last read of peer rows (__syncthreads: every thread's loads have returned, their values
//          being used), the same exchange on end[b][*]. Rank p's launch finishes only when every rank's block b has
//          arrived, for every b, so no rank's next kernel can overwrite its partial while a peer still reads it, and
//          no rank can raise e + 1 in start before every peer has seen e (the waits test equality).
// Block b of every rank handles row b, so the two meetings are per block and no block waits on another block of its
// own GPU (local_ranks > 1: the blocks of the other ranks of the launch, all resident); the grid (at most
// kAllReduceMaxRows blocks) is resident at once on an H200's 132 SMs, so the waits cannot starve.
// A rank that never arrives (a dead peer, a launch missing on one rank) traps the kernel after kPeerTimeoutNs.
#include <cuda/atomic>

#include <type_traits>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/rows/all_reduce_norm.h"
#include "backend/cuda/rows/norm_row.cuh"

namespace beamline::cuda {
namespace {

static_assert(kAllReduceMaxHidden == kNormMaxRegisterRow);
constexpr uint64_t kPeerTimeoutNs = 10'000'000'000ull;
constexpr int kSumThreads = 256;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Thread p < ranks: raises `rank`'s flag for `epoch` in rank p's slots, then waits for rank p's flag in its own.
using SignalSlots = uint32_t (AllReduceSignal::*)[kAllReduceMaxRows][kAllReduceMaxRanks];
__device__ void meet(const AllReducePeers& peers, int32_t rank, SignalSlots slots, uint32_t epoch) {
  const int p = static_cast<int>(threadIdx.x);
  if (p < peers.ranks) {
    uint32_t& theirs = (peers.signal[p]->*slots)[blockIdx.x][rank];
    ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system>(theirs).store(epoch, ::cuda::memory_order_release);
    ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system> mine((peers.signal[rank]->*slots)[blockIdx.x][p]);
    const uint64_t deadline = global_ns() + kPeerTimeoutNs;
    while (mine.load(::cuda::memory_order_acquire) != epoch) {
      if (global_ns() > deadline) __trap();
      __nanosleep(100);
    }
  }
  __syncthreads();
}

// The sum of every rank's row `row`, rank after rank (so every rank computes the same bits). Each rank's loads are
// issued together; the unrolled ranks let the compiler overlap them as far as the 64 registers of a 1024-thread block
// allow.
template <int kRanks>
__device__ __forceinline__ void sum_rows(const AllReducePeers& peers, int64_t row, int64_t hidden,
                                         float (&sum)[kNormPerThread]) {
  load_owned<true>(peers.partial[0] + row * hidden, hidden, sum);
#pragma unroll
  for (int p = 1; p < kRanks; ++p) {
    float part[kNormPerThread];
    load_owned<true>(peers.partial[p] + row * hidden, hidden, part);
#pragma unroll
    for (int k = 0; k < kNormPerThread; ++k) sum[k] += part[k];
  }
}

template <int kRanks, typename W>
__global__ void __launch_bounds__(kNormMaxThreads)
    all_reduce_add_rms_norm_kernel(AllReducePeers peers, float* __restrict__ residual, const W* __restrict__ weight,
                                   const W* __restrict__ next_weight, float eps, float scale, int64_t hidden,
                                   float* __restrict__ out) {
  const bool handshake = peers.signal[0] != nullptr;  // uniform over the grid
  const int32_t rank = peers.rank + static_cast<int32_t>(blockIdx.y);
  __shared__ uint32_t epoch;
  if (handshake) {
    if (threadIdx.x == 0) epoch = peers.signal[rank]->epoch[blockIdx.x] + 1;
    __syncthreads();
    meet(peers, rank, &AllReduceSignal::start, epoch);
  }
  const int64_t row = blockIdx.x, rank_offset = int64_t{blockIdx.y} * gridDim.x * hidden;
  float values[kNormPerThread], sums[kNormPerThread], scales[kNormPerThread];
  float* row_residual = residual + rank_offset + row * hidden;
  sum_rows<kRanks>(peers, row, hidden, values);
  load_owned(row_residual, hidden, sums);
  load_owned(weight, hidden, scales);
  const float inverse = inverse_rms_owned(values, hidden, eps);
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) sums[k] += scale * (values[k] * inverse * scales[k]);
  if (next_weight != nullptr) {
    load_owned(next_weight, hidden, scales);
    const float next_inverse = inverse_rms_owned(sums, hidden, eps);
#pragma unroll
    for (int k = 0; k < kNormPerThread; ++k) values[k] = sums[k] * next_inverse * scales[k];
  }
  float* row_out = next_weight != nullptr ? out + rank_offset + row * hidden : nullptr;
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x + k * blockDim.x);  // rows here are <= kNormMaxRegisterRow
    if (i >= hidden) continue;
    row_residual[i] = sums[k];
    if (row_out != nullptr) row_out[i] = values[k];
  }
  if (handshake) {
    __syncthreads();
    meet(peers, rank, &AllReduceSignal::end, epoch);
    if (threadIdx.x == 0) peers.signal[rank]->epoch[blockIdx.x] = epoch;
  }
}

template <int kRanks>
__global__ void sum_partials_kernel(AllReducePeers peers, int64_t count, float* __restrict__ out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float parts[kRanks];
#pragma unroll
  for (int p = 0; p < kRanks; ++p) parts[p] = __ldcg(peers.partial[p] + i);
  float sum = parts[0];
#pragma unroll
  for (int p = 1; p < kRanks; ++p) sum += parts[p];
  out[i] = sum;
}

// body(std::integral_constant<int, ranks>) for ranks in [1, kAllReduceMaxRanks]; false outside.
template <typename Body>
bool dispatch_ranks(int32_t ranks, Body&& body) {
  switch (ranks) {
    case 1: body(std::integral_constant<int, 1>{}); return true;
    case 2: body(std::integral_constant<int, 2>{}); return true;
    case 3: body(std::integral_constant<int, 3>{}); return true;
    case 4: body(std::integral_constant<int, 4>{}); return true;
    case 5: body(std::integral_constant<int, 5>{}); return true;
    case 6: body(std::integral_constant<int, 6>{}); return true;
    case 7: body(std::integral_constant<int, 7>{}); return true;
    case 8: body(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}

}  // namespace

cudaError_t all_reduce_add_rms_norm(const AllReducePeers& peers, float* residual, const void* weight,
                                    const void* next_weight, DType weight_dtype, float eps, float scale, int64_t rows,
                                    int64_t hidden, float* out, cudaStream_t stream) {
  const bool handshake = peers.signal[0] != nullptr;
  if (hidden > kAllReduceMaxHidden || peers.rank < 0 || peers.local_ranks < 1 ||
      peers.rank + peers.local_ranks > peers.ranks || (handshake && rows * peers.local_ranks > kAllReduceMaxRows))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const dim3 blocks(static_cast<unsigned int>(rows), static_cast<unsigned int>(peers.local_ranks));
  bool known = false;
  const bool ranks_known = dispatch_ranks(peers.ranks, [&](auto ranks) {
    known = dispatch_float(weight_dtype, [&](auto tag) {
      using W = decltype(tag);
      all_reduce_add_rms_norm_kernel<decltype(ranks)::value, W><<<blocks, norm_threads(hidden), 0, stream>>>(
          peers, residual, static_cast<const W*>(weight), static_cast<const W*>(next_weight), eps, scale, hidden,
          out);
    });
  });
  return ranks_known && known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t sum_partials(const AllReducePeers& peers, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const bool known = dispatch_ranks(peers.ranks, [&](auto ranks) {
    sum_partials_kernel<decltype(ranks)::value>
        <<<blocks_for(count, kSumThreads), kSumThreads, 0, stream>>>(peers, count, out);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace beamline::cuda
