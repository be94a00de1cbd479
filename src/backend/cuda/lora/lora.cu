#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/lora/lora.h"

namespace beamline::cuda {
namespace {

constexpr int kShrinkThreads = 256;
constexpr int kExpandThreads = 256;

// shrunk[t, r] = a[i, r] · x[t]: the block's warps take the rank rows in turn.
template <bool kVector>
__global__ void lora_shrink_kernel(const float* x, const float* a, const int32_t* indices, int64_t adapters,
                                   int64_t rank, int64_t in, float* shrunk) {
  const int64_t t = blockIdx.x;
  const int32_t index = indices[t];
  if (index < 0 || index >= adapters) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const float* xt = x + t * in;
  for (int64_t r = warp; r < rank; r += warps) {
    const float* ar = a + (int64_t{index} * rank + r) * in;
    float sum = 0.0f;
    if constexpr (kVector) {
      const auto* a4 = reinterpret_cast<const float4*>(ar);
      const auto* x4 = reinterpret_cast<const float4*>(xt);
      for (int64_t k = lane; k < in / 4; k += 32) {
        const float4 av = a4[k], xv = x4[k];
        sum += av.x * xv.x + av.y * xv.y + av.z * xv.z + av.w * xv.w;
      }
    } else {
      for (int64_t k = lane; k < in; k += 32) sum += ar[k] * xt[k];
    }
    sum = warp_sum(sum);
    if (lane == 0) shrunk[t * rank + r] = sum;
  }
}

// y[t, o] += b[i, o] · shrunk[t]: a thread per output of one row (grid.y), the intermediate in shared memory.
__global__ void lora_expand_kernel(const float* b, const int32_t* indices, int64_t adapters, int64_t rank, int64_t out,
                                   const float* shrunk, float* y) {
  extern __shared__ float row[];
  const int64_t t = blockIdx.y;
  const int32_t index = indices[t];
  if (index < 0) return;
  const int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index >= adapters) {
    if (o < out) y[t * out + o] = NAN;
    return;
  }
  for (int64_t r = threadIdx.x; r < rank; r += blockDim.x) row[r] = shrunk[t * rank + r];
  __syncthreads();
  if (o >= out) return;
  const float* bo = b + (int64_t{index} * out + o) * rank;
  float sum = 0.0f;
  for (int64_t r = 0; r < rank; ++r) sum += bo[r] * row[r];
  y[t * out + o] += sum;
}

}  // namespace

cudaError_t lora_gathered(const float* x, const float* a, const float* b, const int32_t* indices, int64_t rows,
                          int64_t adapters, int64_t rank, int64_t in, int64_t out, float* shrunk, float* y,
                          cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  const bool vector = in % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0;
  if (vector)
    lora_shrink_kernel<true><<<static_cast<unsigned>(rows), kShrinkThreads, 0, stream>>>(x, a, indices, adapters, rank,
                                                                                         in, shrunk);
  else
    lora_shrink_kernel<false><<<static_cast<unsigned>(rows), kShrinkThreads, 0, stream>>>(x, a, indices, adapters,
                                                                                          rank, in, shrunk);
  const dim3 grid(static_cast<unsigned>((out + kExpandThreads - 1) / kExpandThreads), static_cast<unsigned>(rows));
  lora_expand_kernel<<<grid, kExpandThreads, static_cast<size_t>(rank) * sizeof(float), stream>>>(
      b, indices, adapters, rank, out, shrunk, y);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
