// The experts for few tokens: decode reads each routed expert's weights once and does almost no arithmetic on
// them, so the work is a bandwidth problem, not a GEMM. Each block owns one routed expert and a slice of its
// output rows; each warp streams one weight row with 16-byte loads and dots it with the F32 activations of every
// token routed to that expert (no rounding of the activations, unlike a tensor-core GEMM).
//
// Bookkeeping without a pass of its own: the grid's y index is an assignment slot (token, j); the block whose slot
// is the first to name an expert owns that expert and collects that expert's slots itself, the blocks of the
// expert's later slots return at once. So the router's output feeds these kernels directly. One token's down pass
// instead covers all its experts per output row and sums them itself (down_combine_kernel).
#include <algorithm>
#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/moe/moe.h"

namespace beamline::cuda {
namespace {

constexpr int kStreamWarps = 8;            // output rows per block, one per warp
constexpr int kStreamThreads = kStreamWarps * 32;
constexpr int kTokensPerPass = 8;          // tokens whose sums a warp keeps while streaming a row once
// A single token (decode at batch 1) needs one accumulator per row, which leaves registers for more loads in flight.
constexpr int kElementsPerLoad = 8;        // 16 bytes of BF16/F16
constexpr int kElementsPerWarpStep = 32 * kElementsPerLoad;

// The expert of slot blockIdx.y and, if this block owns it (first slot naming it), its slots in ascending order.
// Returns the number of slots, 0 when the block has nothing to do.
__device__ int32_t claim_expert(const int32_t* ids, int32_t assignments, int32_t experts, int32_t* slots,
                                int32_t& expert) {
  const int32_t slot = blockIdx.y;
  expert = ids[slot];
  if (expert < 0 || expert >= experts) return 0;
  bool earlier = false;
  for (int32_t s = threadIdx.x; s < slot; s += blockDim.x) earlier = earlier || ids[s] == expert;
  if (__syncthreads_or(earlier)) return 0;
  __shared__ int32_t count;
  if (threadIdx.x < 32) {
    int32_t found = 0;
    for (int32_t base = slot; base < assignments; base += 32) {
      const int32_t s = base + static_cast<int32_t>(threadIdx.x);
      const unsigned match = __ballot_sync(0xffffffffu, s < assignments && ids[s] == expert);
      if (s < assignments && ids[s] == expert) slots[found + __popc(match & ((1u << threadIdx.x) - 1u))] = s;
      found += __popc(match);
    }
    if (threadIdx.x == 0) count = found;
  }
  __syncthreads();
  return count;
}

// activated[slot, i] = silu(gate_e[i] · h[token]) * (up_e[i] · h[token]) for every slot routed to expert e, with
// delta[slot] (ExpertDeltas::gate_up, null for none) added to both pre-activations first.
template <typename W, int kTokens>
__global__ void __launch_bounds__(kStreamThreads) gate_up_kernel(const float* h, const int32_t* ids,
                                                                 int32_t assignments, int32_t top_k,
                                                                 ExpertPointers experts, const float* delta,
                                                                 float* activated) {
  __shared__ int32_t slots[kMaxStreamingAssignments];
  int32_t expert = 0;
  const int32_t count = claim_expert(ids, assignments, experts.experts, slots, expert);
  const int64_t row = int64_t{blockIdx.x} * kStreamWarps + threadIdx.x / 32;
  if (count == 0 || row >= experts.intermediate) return;
  const int lane = threadIdx.x % 32;
  const int64_t hidden = experts.hidden;
  const W* gate = static_cast<const W*>(experts.gate[expert]) + row * hidden;
  const W* up = static_cast<const W*>(experts.up[expert]) + row * hidden;
  for (int32_t first = 0; first < count; first += kTokens) {
    const int32_t tokens = min(kTokens, count - first);
    float gate_sum[kTokens] = {}, up_sum[kTokens] = {};
    constexpr int kUnroll = kTokens == 1 ? 8 : 4;
#pragma unroll kUnroll
    for (int64_t k = int64_t{lane} * kElementsPerLoad; k < hidden; k += kElementsPerWarpStep) {
      float g[kElementsPerLoad], u[kElementsPerLoad];
      unpack(load_streaming(gate + k), g, W{});
      unpack(load_streaming(up + k), u, W{});
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t < tokens) {
          const float* x = h + int64_t{slots[first + t] / top_k} * hidden + k;
          gate_sum[t] += dot8(g, x);
          up_sum[t] += dot8(u, x);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float g = warp_sum(gate_sum[t]), u = warp_sum(up_sum[t]);
      if (lane == 0 && t < tokens) {
        const int64_t slot = slots[first + t];
        if (delta != nullptr) {
          g += delta[(2 * slot) * experts.intermediate + row];
          u += delta[(2 * slot + 1) * experts.intermediate + row];
        }
        activated[slot * experts.intermediate + row] = silu(g) * u;
      }
    }
  }
}

// expert_out[slot, n] = weight[slot] * (down_e[n] · activated[slot] + delta[slot, n]) for every slot routed to
// expert e (delta: ExpertDeltas::down, null for none).
template <typename W, int kTokens>
__global__ void __launch_bounds__(kStreamThreads) down_kernel(const float* activated, const int32_t* ids,
                                                              const float* weights, int32_t assignments,
                                                              ExpertPointers experts, const float* delta,
                                                              float* expert_out) {
  __shared__ int32_t slots[kMaxStreamingAssignments];
  int32_t expert = 0;
  const int32_t count = claim_expert(ids, assignments, experts.experts, slots, expert);
  const int64_t row = int64_t{blockIdx.x} * kStreamWarps + threadIdx.x / 32;
  if (count == 0 || row >= experts.hidden) return;
  const int lane = threadIdx.x % 32;
  const int64_t intermediate = experts.intermediate;
  const W* down = static_cast<const W*>(experts.down[expert]) + row * intermediate;
  for (int32_t first = 0; first < count; first += kTokens) {
    const int32_t tokens = min(kTokens, count - first);
    float sum[kTokens] = {};
    constexpr int kUnroll = kTokens == 1 ? 8 : 2;
#pragma unroll kUnroll
    for (int64_t k = int64_t{lane} * kElementsPerLoad; k < intermediate; k += kElementsPerWarpStep) {
      float w[kElementsPerLoad];
      unpack(load_streaming(down + k), w, W{});
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (t < tokens) sum[t] += dot8(w, activated + int64_t{slots[first + t]} * intermediate + k);
    }
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float total = warp_sum(sum[t]);
      if (lane == 0 && t < tokens) {
        const int32_t slot = slots[first + t];
        if (delta != nullptr) total += delta[int64_t{slot} * experts.hidden + row];
        expert_out[int64_t{slot} * experts.hidden + row] = weights[slot] * total;
      }
    }
  }
}

// One token, the combine fused: out[n] = sum over j in order of weight[j] * (down_{ids[j]}[n] · activated[j] +
// delta[j, n]) (delta: ExpertDeltas::down, null for none), NaN when an id is out of range. Each warp streams row n of all the token's experts, one 16-byte load of each in flight
// per lane and step, so the down projection keeps as many bytes in flight as gate|up although its rows are half as
// long, and no expert_out round trip or combine launch follows. Small blocks held to 48 registers, so all of Beam's
// 5120 rows are resident at once (20 blocks, 40 warps per SM) instead of a second, partly filled wave.
constexpr int kFusedTopK = 8;  // the most experts per token this kernel takes
constexpr int kFusedDownWarps = 2;
constexpr int kFusedDownBlocksPerSm = 20;
template <typename W>
__global__ void __launch_bounds__(kFusedDownWarps * 32, kFusedDownBlocksPerSm)
    down_combine_kernel(const float* activated, const int32_t* ids, const float* weights, int32_t top_k,
                        ExpertPointers experts, const float* delta, float* out) {
  const int64_t row = int64_t{blockIdx.x} * kFusedDownWarps + threadIdx.x / 32;
  if (row >= experts.hidden) return;
  const int lane = threadIdx.x % 32;
  const int64_t intermediate = experts.intermediate;
  const W* down[kFusedTopK];
  bool valid = true;
#pragma unroll
  for (int j = 0; j < kFusedTopK; ++j) {
    const int32_t e = j < top_k ? ids[j] : 0;
    const bool known = e >= 0 && e < experts.experts;
    valid = valid && known;
    // An unknown expert reads expert 0's row, so every load stays in bounds; the output is NaN then anyway.
    down[j] = static_cast<const W*>(experts.down[known ? e : 0]) + row * intermediate;
  }
  float sum[kFusedTopK] = {};
#pragma unroll 1
  for (int64_t k = int64_t{lane} * kElementsPerLoad; k < intermediate; k += kElementsPerWarpStep) {
#pragma unroll
    for (int j = 0; j < kFusedTopK; ++j) {
      if (j < top_k) {
        float w[kElementsPerLoad];
        unpack(load_streaming(down[j] + k), w, W{});
        sum[j] += dot8(w, activated + j * intermediate + k);
      }
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < kFusedTopK; ++j) {
    float dot = warp_sum(sum[j]);
    if (delta != nullptr && j < top_k) dot += delta[j * experts.hidden + row];
    if (j < top_k) total += weights[j] * dot;
  }
  if (lane == 0) out[row] = valid ? total : __int_as_float(0x7fc00000);
}

// out[t] = sum over j in order of expert_out[t * top_k + j]; NaN for a token with an expert id out of range. One
// block per (token, slice of kCombineThreads features): enough blocks to keep the reads in flight for few tokens.
constexpr int kCombineThreads = 256;
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const float* expert_out, const int32_t* ids,
                                                                  int32_t top_k, int32_t experts, int64_t hidden,
                                                                  float* out) {
  const int64_t token = blockIdx.x, i = int64_t{blockIdx.y} * kCombineThreads + threadIdx.x;
  if (i >= hidden) return;
  bool valid = true;
  float sum = 0.0f;
  for (int32_t j = 0; j < top_k; ++j) {
    const int32_t e = ids[token * top_k + j];
    valid = valid && e >= 0 && e < experts;
    sum += expert_out[(token * top_k + j) * hidden + i];
  }
  out[token * hidden + i] = valid ? sum : __int_as_float(0x7fc00000);
}

}  // namespace

cudaError_t moe_combine(const float* expert_out, const int32_t* ids, int64_t rows, int32_t top_k, int32_t experts,
                        int64_t hidden, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(rows), blocks_for(hidden, kCombineThreads));
  combine_kernel<<<grid, kCombineThreads, 0, stream>>>(expert_out, ids, top_k, experts, hidden, out);
  return cudaGetLastError();
}

bool moe_streaming_supported(int64_t assignments, int64_t hidden, int64_t intermediate) {
  return assignments <= kMaxStreamingAssignments && hidden % kElementsPerLoad == 0 && intermediate % kElementsPerLoad == 0;
}

cudaError_t moe_streaming(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                          const ExpertPointers& experts, float* activated, float* expert_out, float* out,
                          cudaStream_t stream, bool row_invariant, const ExpertDeltas* deltas) {
  if (rows == 0) return cudaSuccess;
  if (!moe_streaming_supported(rows * top_k, experts.hidden, experts.intermediate)) return cudaErrorInvalidValue;
  const auto assignments = static_cast<int32_t>(rows * top_k);
  cudaError_t status = cudaErrorInvalidValue;
  // One token alone takes kernels of its own (one accumulator per row, the combine fused) unless rows must not
  // depend on their batch.
  const bool alone = rows == 1 && !row_invariant;
  auto launch = [&](auto tag) {
    using W = decltype(tag);
    const dim3 up_grid(blocks_for(experts.intermediate, kStreamWarps), static_cast<unsigned int>(assignments));
    // The router names an expert once per token, so one token gives each expert one slot (more take more passes).
    const float* gate_up = gate_up_delta(deltas);
    if (alone)
      gate_up_kernel<W, 1><<<up_grid, kStreamThreads, 0, stream>>>(h, ids, assignments, top_k, experts, gate_up,
                                                                   activated);
    else
      gate_up_kernel<W, kTokensPerPass><<<up_grid, kStreamThreads, 0, stream>>>(h, ids, assignments, top_k, experts,
                                                                                gate_up, activated);
    if (status = cudaGetLastError(); status != cudaSuccess) return;
    if (status = compute_down_delta(deltas, SwigluRows{activated}); status != cudaSuccess) return;
    const float* down = down_delta(deltas);
    if (alone && top_k <= kFusedTopK) {
      down_combine_kernel<W><<<blocks_for(experts.hidden, kFusedDownWarps), kFusedDownWarps * 32, 0, stream>>>(
          activated, ids, weights, top_k, experts, down, out);
      status = cudaGetLastError();
      return;
    }
    const dim3 down_grid(blocks_for(experts.hidden, kStreamWarps), static_cast<unsigned int>(assignments));
    if (alone)
      down_kernel<W, 1><<<down_grid, kStreamThreads, 0, stream>>>(activated, ids, weights, assignments, experts,
                                                                  down, expert_out);
    else
      down_kernel<W, kTokensPerPass><<<down_grid, kStreamThreads, 0, stream>>>(activated, ids, weights, assignments,
                                                                               experts, down, expert_out);
    if (status = cudaGetLastError(); status != cudaSuccess) return;
    status = moe_combine(expert_out, ids, rows, top_k, experts.experts, experts.hidden, out, stream);
  };
  if (experts.dtype == DType::BF16) launch(__nv_bfloat16{});
  if (experts.dtype == DType::F16) launch(__half{});
  return status;
}

}  // namespace beamline::cuda
