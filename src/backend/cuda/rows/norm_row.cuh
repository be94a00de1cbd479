#pragma once
// A row of a norm held in registers, shared by the per-row kernels (rows.cu) and the fused all-reduce + norm
// (all_reduce_norm.cu).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/common/device_common.cuh"

namespace beamline::cuda {

// Per-row kernels: a block per row. Rows of up to kNormMaxThreads * kNormPerThread values (Beam-1.0's are 5,120)
// stay in registers: each thread issues all its loads (the row, the weight and for add_rms_norm the residual) before
// the reduction, so a row costs one memory latency rather than one per loop trip — at decode, one row per launch,
// that latency is the whole kernel (11–12 µs per norm with dependent loops, 32 norms a step). Wider norm rows take
// rows.cu's looping kernels; the embedding and SSMax, which keep nothing across the row, take kNormPerThread values
// per thread per trip.
constexpr int kNormPerThread = 8;
constexpr int kNormMaxThreads = 1024;
constexpr int64_t kNormMaxRegisterRow = int64_t{kNormPerThread} * kNormMaxThreads;

// The fewest whole warps that hold a row of `hidden` values at kNormPerThread each, at most kNormMaxThreads.
inline unsigned int norm_threads(int64_t hidden) {
  const int64_t warps = (hidden + 32 * kNormPerThread - 1) / (32 * kNormPerThread);
  return static_cast<unsigned int>(std::clamp<int64_t>(warps, 1, kNormMaxThreads / 32) * 32);
}

// Values i = threadIdx.x + k * blockDim.x of a row as F32 (0 past its end), all loads in flight at once.
// kBypassL1: loaded through L2 only (ld.global.cg), for memory that another GPU writes between launches.
template <bool kBypassL1 = false, typename T>
__device__ __forceinline__ void load_owned(const T* __restrict__ row, int64_t hidden, float (&values)[kNormPerThread]) {
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x + k * blockDim.x);  // rows here are <= kNormMaxRegisterRow
    if constexpr (kBypassL1)
      values[k] = i < hidden ? __ldcg(row + i) : 0.0f;
    else
      values[k] = i < hidden ? to_float(row[i]) : 0.0f;
  }
}

// 1 / sqrt(mean(x²) + eps) of a row whose values the block's threads hold (N each, 0 past the row's end).
template <int N>
__device__ __forceinline__ float inverse_rms_owned(const float (&values)[N], int64_t hidden, float eps) {
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) sum += values[k] * values[k];
  sum = block_sum(sum);
  return 1.0f / sqrtf(sum / static_cast<float>(hidden) + eps);
}

// The sandwich norm's residual add over a thread's values: sums += scale * rms(values, weights), with `inverse` from
// inverse_rms_owned(values).
template <int N>
__device__ __forceinline__ void add_scaled_norm(float (&sums)[N], const float (&values)[N], float inverse,
                                                const float (&scales)[N], float scale) {
#pragma unroll
  for (int k = 0; k < N; ++k) sums[k] += scale * (values[k] * inverse * scales[k]);
}

}  // namespace beamline::cuda
