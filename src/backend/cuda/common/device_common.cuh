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

// SwiGLU's gate activation, as the CPU reference computes it (model-format.md §4).
__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

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

// Eight 16-bit floats (one 16-byte load of a BF16/F16 weight row) as F32.
__device__ __forceinline__ void unpack(const uint4& bits, float (&out)[8], __nv_bfloat16) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void unpack(const uint4& bits, float (&out)[8], __half) {
  const auto* pairs = reinterpret_cast<const __half2*>(&bits);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Weights that are read once: past L1, so that the activations, read by every warp of the SM, stay there.
__device__ __forceinline__ uint4 load_streaming(const void* address) {
  return __ldcs(static_cast<const uint4*>(address));
}

// w · x[0, 8) for an unpacked weight chunk and 16-byte aligned F32 activations.
__device__ __forceinline__ float dot8(const float (&w)[8], const float* x) {
  const float4 a = *reinterpret_cast<const float4*>(x);
  const float4 b = *reinterpret_cast<const float4*>(x + 4);
  return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
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
