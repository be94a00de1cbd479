// The KV scales' amax (Backend::amax_scale, vLLM's --calculate-kv-scales): a grid-stride max of |x| per block,
// combined into out[0] by an integer atomicMax (non-negative floats order as their bit patterns), then one thread
// turns the maximum into the scale. Three stream operations and no host read, so that it runs inside a step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/common/device_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kAmaxThreads = 256;
constexpr unsigned int kMaxAmaxBlocks = 1024;

__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(const float* x, int64_t n, float* out) {
  float amax = 0.0f;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    amax = fmaxf(amax, fabsf(x[i]));  // fmaxf skips NaN
  amax = warp_max(amax);
  __shared__ float warp_amax[kAmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  if (warp != 0) return;
  amax = lane < kAmaxThreads / 32 ? warp_amax[lane] : 0.0f;
  amax = warp_max(amax);
  if (lane == 0) atomicMax(reinterpret_cast<int*>(out), __float_as_int(amax));
}

__global__ void amax_to_scale_kernel(float divisor, float* out) {
  const float amax = out[0];
  out[0] = amax > 0.0f && isfinite(amax) ? amax / divisor : 1.0f;
}

}  // namespace

cudaError_t amax_scale(const float* x, int64_t n, float divisor, float* out, cudaStream_t stream) {
  if (const cudaError_t status = cudaMemsetAsync(out, 0, sizeof(float), stream); status != cudaSuccess) return status;
  if (n > 0) {
    const unsigned int blocks = std::min<unsigned int>(blocks_for(n, kAmaxThreads), kMaxAmaxBlocks);
    amax_kernel<<<blocks, kAmaxThreads, 0, stream>>>(x, n, out);
    if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  amax_to_scale_kernel<<<1, 1, 0, stream>>>(divisor, out);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
