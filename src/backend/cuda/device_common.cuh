#pragma once
// Device-side helpers shared by the backend's .cu files: element conversions, reductions, dtype dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace beamline::cuda {

__host__ __device__ __forceinline__ float to_float(float v) { return v; }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__host__ __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__host__ __device__ __forceinline__ T from_float(float v);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < warps ? partial[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();
  return result;
}

// Calls body(T{}) with T the C++ type of a float dtype (F32, F16, BF16); false for any other dtype.
template <typename Body>
bool dispatch_float(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::F32:
      body(float{});
      return true;
    case DType::F16:
      body(__half{});
      return true;
    case DType::BF16:
      body(__nv_bfloat16{});
      return true;
    default:
      return false;
  }
}

inline unsigned int blocks_for(int64_t n, int threads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

}  // namespace beamline::cuda
