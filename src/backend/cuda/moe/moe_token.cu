// One token of BF16 experts (decode at batch 1) on the tensor cores with the weights staged through shared memory:
// quant/staged_moe.cuh's kernels with the reader below (moe.h moe_token_staged). Before this, one token took the
// CUDA-core streaming kernels (moe_streaming.cu: each warp a weight row, F32 FMAs), which BEAMLINE_CUDA_TOKEN_MOE=ring
// or =legacy still select.
//
// Exactness: the F32 activations enter the BF16 mma as three BF16 terms (hi = bf16(x), lo = bf16(x - hi),
// lo2 = bf16(x - hi - lo): the 24 bits of x, like OperandPrecision::Split's three terms), each an N column of the
// same mma (columns 0, 1, 2; the other five are zero), so one mma.sync per 16 k products of a weight tile: BF16 x BF16
// products are exact in FP32 and summed in FP32, so the result equals the streaming kernels' FP32 dots up to
// summation order, in --dtype float32 and bfloat16 alike. Lane (g, c) of a tile holds columns 2c, 2c + 1: lanes c = 0
// (hi + lo) and c = 1 (lo2) are added at the end.
//
// Operand layout: a stage is 64 k of each row (128 bytes). Lane (g, c) reads chunks c and 4 + c of rows g and g + 8
// (eight BF16, four pairs p0..p3 each); chunk 4h + c feeds mma 2h (p0, p1) and 2h + 1 (p2, p3), pair p0 as k columns
// 2c, 2c + 1 and p1 as 2c + 8, 2c + 9. So logical k (2c, 2c + 1) of mma 2h + m is physical k 8 (4h + c) + 4m + (0, 1):
// B follows by reading the terms in their natural order, one 16-byte load of term g per chunk.
#include <cuda_bf16.h>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/mma_f16.cuh"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/quant/staged_moe.cuh"

namespace beamline::cuda {
namespace {

// The three BF16 terms of the activations in shared memory, natural order, each padded to whole stages and followed by
// 16 words so that lanes g = 0 and 1 (terms 0 and 1) read distinct banks.
struct Bf16Terms {
  uint32_t* words;  // term t's pair p at words[t * stride + p]
  int64_t stride;
};
struct Bf16TermsOperand {
  using View = Bf16Terms;
  static constexpr int kTerms = 3;
  static __host__ __device__ int64_t stride(int64_t k) { return (k + 63) / 64 * 32 + 16; }
  static __host__ __device__ int64_t bytes(int64_t k) { return kTerms * stride(k) * 4; }
  static __device__ View at(void* base, int64_t k) { return {static_cast<uint32_t*>(base), stride(k)}; }
  // Pairs first * 32 + lane, + stride * 32, ... of x[0, k) (k even, x 8-byte aligned); past k zeros.
  static __device__ void write(const float* x, int64_t k, const View& view, int first, int stride_warps, int lane) {
    for (int64_t p = int64_t{first} * 32 + lane; p < view.stride; p += int64_t{stride_warps} * 32) {
      const float2 v = 2 * p < k ? *reinterpret_cast<const float2*>(x + 2 * p) : make_float2(0.0f, 0.0f);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(v.x, v.y);
      const float2 rest = make_float2(v.x - __low2float(hi), v.y - __high2float(hi));
      const __nv_bfloat162 lo = __floats2bfloat162_rn(rest.x, rest.y);
      const __nv_bfloat162 lo2 = __floats2bfloat162_rn(rest.x - __low2float(lo), rest.y - __high2float(lo));
      view.words[p] = *reinterpret_cast<const uint32_t*>(&hi);
      view.words[view.stride + p] = *reinterpret_cast<const uint32_t*>(&lo);
      view.words[2 * view.stride + p] = *reinterpret_cast<const uint32_t*>(&lo2);
    }
  }
};

struct Bf16Stage {
  using Operand = Bf16TermsOperand;
  static constexpr int kStageK = kStageRowBytes / 2;
  static constexpr int kScaleBytes = 0;
  const uint8_t* weights[2];
  int64_t first_row[2];
  int64_t row_count, k;

  static __device__ Bf16Stage make(const ExpertPointers& experts, int32_t e, const int (&matrix)[2],
                                   const int64_t (&first)[2], int64_t rows, int64_t k) {
    Bf16Stage stage;
    stage.row_count = rows;
    stage.k = k;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const void* const* table = matrix[i] == 0 ? experts.gate : matrix[i] == 1 ? experts.up : experts.down;
      stage.weights[i] = static_cast<const uint8_t*>(table[e]);
      stage.first_row[i] = first[i];
    }
    return stage;
  }
  __device__ int64_t row_bytes() const { return 2 * k; }
  __device__ const uint8_t* row_codes(int i, int t) const {
    return weights[i] + min(first_row[i] + t, row_count - 1) * (2 * k);
  }
  __device__ void copy_scales(int, unsigned char*, int) const {}

  __device__ __forceinline__ void consume(const unsigned char* stage_rows, const unsigned char*, int s,
                                          const Bf16Terms& terms, int lane, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4, swizzle = stage_swizzle(g);
    float d[2][4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 b{};  // term g's pairs at 64 s + 8 (4h + c): B of mmas 2h (x, y) and 2h + 1 (z, w)
      if (g < Bf16TermsOperand::kTerms)
        b = *reinterpret_cast<const uint4*>(terms.words + g * terms.stride + 32 * s + 4 * (4 * h + c));
      const int chunk = 16 * ((4 * h + c) ^ swizzle);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 row_g = *reinterpret_cast<const uint4*>(stage_rows + (kTokenTileRows * i + g) * kStageRowBytes + chunk);
        const uint4 row_g8 =
            *reinterpret_cast<const uint4*>(stage_rows + (kTokenTileRows * i + 8 + g) * kStageRowBytes + chunk);
        const uint32_t first[4] = {row_g.x, row_g8.x, row_g.y, row_g8.y};
        const uint32_t second[4] = {row_g.z, row_g8.z, row_g.w, row_g8.w};
        mma_bf16(d[i], first, b.x, b.y);
        mma_bf16(d[i], second, b.z, b.w);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      total[i][0] += d[i][0] + d[i][1];
      total[i][1] += d[i][2] + d[i][3];
    }
  }
  // Lane c = 0 holds hi + lo, lane c = 1 lo2 (its second column is zero).
  __device__ void finish(float (&total)[2][2]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) total[i][r] += __shfl_down_sync(0xffffffffu, total[i][r], 1);
  }
};

}  // namespace

bool moe_token_staged_supported(const ExpertPointers& experts, int32_t top_k) {
  return experts.dtype == DType::BF16 && experts.hidden % 8 == 0 && experts.intermediate % 8 == 0 &&
         token_moe_bf16_staged() &&
         staged_token_moe_fits<Bf16Stage>(experts.hidden, experts.intermediate, top_k);
}

cudaError_t moe_token_staged(const float* h, const int32_t* ids, const float* weights, int32_t top_k,
                             const ExpertPointers& experts, const TokenMoeScratch& scratch, float* out,
                             cudaStream_t stream) {
  if (!moe_token_staged_supported(experts, top_k) || reinterpret_cast<uintptr_t>(h) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(scratch.activated) % 16 != 0)
    return cudaErrorInvalidValue;
  return launch_staged_token_moe<Bf16Stage>(h, ids, weights, 1, top_k, experts, scratch, out, stream);
}

}  // namespace beamline::cuda
