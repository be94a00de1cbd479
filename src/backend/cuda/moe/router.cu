// The router GEMV at decode. cuBLAS's F32 GEMV took 6.7 µs for Beam-1.0's router (256 × 5,120 F32, 5.2 MB: 1.1 µs of
// HBM) at one row, five times a step of the 8-layer model. Here a block per expert reads its router row once, every
// 16-byte load of it in flight before the first multiply, and applies it to each of the few rows (h stays in L1/L2).
#include <cstdint>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/moe/router_gemv.h"

namespace beamline::cuda {
namespace {

constexpr int kGemvThreads = 128;
constexpr int kChunksPerThread = 32;  // float4 chunks: rows of up to 128 * 32 * 4 = 16,384 values
constexpr int64_t kMaxHidden = int64_t{kGemvThreads} * kChunksPerThread * 4;

__global__ void __launch_bounds__(kGemvThreads)
    router_gemv_kernel(const float4* __restrict__ h, const float4* __restrict__ router, int64_t rows, int64_t chunks,
                       int64_t experts, float* __restrict__ logits) {
  const int64_t expert = blockIdx.x, first = int64_t{blockIdx.y} * kRouterGemvMaxRows;
  rows = min(rows - first, kRouterGemvMaxRows);
  h += first * chunks;
  logits += first * experts;
  const float4* weights = router + expert * chunks;
  float4 w[kChunksPerThread];
#pragma unroll
  for (int k = 0; k < kChunksPerThread; ++k) {
    const int64_t c = threadIdx.x + int64_t{k} * kGemvThreads;
    w[k] = c < chunks ? weights[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float4* x = h + r * chunks;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * kGemvThreads;
      if (c < chunks) {
        const float4 v = x[c];
        sum += v.x * w[k].x + v.y * w[k].y + v.z * w[k].z + v.w * w[k].w;
      }
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) logits[r * experts + expert] = sum;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool router_gemv_supported(const float* h, const float* router, int64_t hidden) {
  return hidden % 4 == 0 && hidden <= kMaxHidden && aligned16(h) &&
         aligned16(router);
}

cudaError_t router_gemv(const float* h, const float* router, int64_t rows, int64_t hidden, int64_t experts,
                        float* logits, cudaStream_t stream) {
  if (rows == 0 || experts == 0) return cudaSuccess;
  const int64_t tiles = (rows + kRouterGemvMaxRows - 1) / kRouterGemvMaxRows;
  if (!router_gemv_supported(h, router, hidden) || tiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(experts), static_cast<unsigned int>(tiles));
  router_gemv_kernel<<<grid, kGemvThreads, 0, stream>>>(
      reinterpret_cast<const float4*>(h), reinterpret_cast<const float4*>(router), rows, hidden / 4, experts, logits);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
