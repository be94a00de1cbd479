#pragma once
// E4M3 codes to F32 in registers, shared by the FP8 block-128 and the MXFP8/NVFP4 streaming kernels.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace beamline::cuda {

// Sixteen E4M3 codes (one 16-byte load) as F32, exactly (E4M3 is a subset of F16).
__device__ __forceinline__ void unpack_e4m3(const uint4& bits, float (&out)[16]) {
  const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&raw));
      out[4 * w + 2 * h] = f.x;
      out[4 * w + 2 * h + 1] = f.y;
    }
  }
}

}  // namespace beamline::cuda
