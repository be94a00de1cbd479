#pragma once
// One token's F32 activations as the F16 B operand of the tensor-core matrix-vector kernels of quantized weights
// (quant/fp8_token_moe.cu, quant/micro_rows.cu): per 128-wide block, hi = f16(x s) and lo = f16(x s - hi) with s a
// power of two that puts the block's largest |x| in [2^14, 2^15), so hi + lo carries 22 bits of every element (and,
// below 2^-3 s, an absolute error under 2^-39 of the block's largest); 1/s is kept per block for the promotion of
// the block's sums. Stored in shared memory in the order the kernels' lanes read their B registers: two words per
// four elements, elements (0, 2) then (1, 3), matching e4m3x4_to_half2's even and odd pairs, or (0, 1) then (2, 3) in
// the groups of four whose weights a kernel decodes by cvt (kWords, mma_f16.cuh's cvt_word).
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/mma_f16.cuh"

namespace beamline::cuda {

constexpr int64_t kSplitBlock = 128;

__host__ __device__ constexpr int64_t split_blocks(int64_t k) { return (k + kSplitBlock - 1) / kSplitBlock; }

// The activation split of a vector of `k` elements in shared memory: hi and lo words (two F16 each) and 1/s per block.
struct Split {
  uint32_t* hi;
  uint32_t* lo;
  float* unscale;
};
// Padded to 16 bytes, so that the splits of several vectors can follow one another.
__host__ __device__ constexpr int64_t split_bytes(int64_t k) {
  return split_blocks(k) * kSplitBlock * 4 + (split_blocks(k) * 4 + 15) / 16 * 16;
}
__device__ inline Split split_at(void* base, int64_t k) {
  const int64_t words = split_blocks(k) * kSplitBlock / 2;
  auto* hi = static_cast<uint32_t*>(base);
  return {hi, hi + words, reinterpret_cast<float*>(hi + 2 * words)};
}

// Writes the split of x[0, k) (16-byte aligned, k a multiple of 4) for blocks first, first + stride, ...: one warp per
// 128-wide block, four elements per lane (lane l: group of four 32 b + l); elements past k are zero.
template <CvtWords kWords = CvtWords::None>
__device__ inline void split_activations(const float* __restrict__ x, int64_t k, const Split& split, int first,
                                         int stride, int lane) {
  const int blocks = static_cast<int>(split_blocks(k));
#pragma unroll 4
  for (int b = first; b < blocks; b += stride) {
    const int64_t i = int64_t{b} * kSplitBlock + lane * 4;
    const float4 v = i < k ? *reinterpret_cast<const float4*>(x + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    const int shift = f16_shift(amax);
    const float s = ldexpf(1.0f, shift);
    uint2 hi, lo;  // two words per four elements: (0, 2) then (1, 3), or by cvt's pairs (0, 1) then (2, 3)
    if (cvt_word(kWords, lane)) {
      split_half2(v.x * s, v.y * s, hi.x, lo.x);
      split_half2(v.z * s, v.w * s, hi.y, lo.y);
    } else {
      split_half2(v.x * s, v.z * s, hi.x, lo.x);
      split_half2(v.y * s, v.w * s, hi.y, lo.y);
    }
    *reinterpret_cast<uint2*>(split.hi + i / 2) = hi;
    *reinterpret_cast<uint2*>(split.lo + i / 2) = lo;
    if (lane == 0) split.unscale[b] = ldexpf(1.0f, -shift);
  }
}

}  // namespace beamline::cuda
