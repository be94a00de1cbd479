#pragma once
// F16 tensor-core operands made from exact data: E4M3 codes decoded to F16 by bit operations, F32 values split into
// two F16 parts, and the mma.sync m16n8k16 products (F16, BF16) with F32 accumulators. Shared by the one-token expert
// kernels (quant/fp8_token_moe.cu, quant/micro_rows.cu, moe/moe_token.cu), the grouped MoE GEMMs (moe/moe_mma.cu)
// and the decode attention over FP8 KV pools (attention/decode.cu).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace beamline::cuda {

// d += a (16 x 16, row-major) * b (16 x 8, column-major), F16 operands, FP32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with BF16 operands.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (x, y) as F16 pairs hi = f16(x, y) and lo = f16(x - hi.x, y - hi.y), x in the low half. hi + lo keeps 22 bits of
// each value when |x| and |y| lie in [2^-3, 2^15] (below that, an absolute error under 2^-25): callers scale their
// values by a power of two into that range.
// Two packed conversions (cvt.rn.f16x2.f32) instead of four scalar ones: the same roundings, half the instructions.
__device__ __forceinline__ void split_half2(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 high = __floats2half2_rn(x, y);
  const float2 rounded = __half22float2(high);
  const __half2 low = __floats2half2_rn(x - rounded.x, y - rounded.y);
  hi = *reinterpret_cast<const uint32_t*>(&high);
  lo = *reinterpret_cast<const uint32_t*>(&low);
}

// 2^shift with 2^shift * amax in [2^14, 2^15) (F16's full precision short of its 65504), clamped so that 2^shift is
// a normal F32; 0 for amax = 0.
__device__ __forceinline__ int f16_shift(float amax) {
  return amax > 0.0f ? min(max(14 - ilogbf(amax), -100), 100) : 0;
}

// Four E4M3 codes (one word) as two F16 pairs, exactly: codes 0 and 2 in `even`, 1 and 3 in `odd`. E4M3's sign,
// exponent and mantissa bits placed at F16's bits 15, 10-13 and 7-9 make the F16 of the value times 2^-8 (exponent
// bias 15 against 7; E4M3's subnormals land on F16's), and one F16 multiplication by 2^8 restores the value exactly,
// so the tensor cores never see a subnormal. Bit operations instead of conversion instructions, which issue at a
// quarter of their rate. The codes 0x7f/0xff, NaN in E4M3 and never written by a quantizer (which saturates at 448),
// read as +-480.
__device__ __forceinline__ void e4m3x4_to_half2(uint32_t w, uint32_t& even, uint32_t& odd) {
  const uint32_t even_bits = ((w & 0x007f007fu) << 7) | ((w & 0x00800080u) << 8);
  const uint32_t odd_bits = ((w & 0x7f007f00u) >> 1) | (w & 0x80008000u);
  const __half2 unbias = __float2half2_rn(256.0f);
  const __half2 e = __hmul2(*reinterpret_cast<const __half2*>(&even_bits), unbias);
  const __half2 o = __hmul2(*reinterpret_cast<const __half2*>(&odd_bits), unbias);
  even = *reinterpret_cast<const uint32_t*>(&e);
  odd = *reinterpret_cast<const uint32_t*>(&o);
}

// Two E4M3 codes (bits 0-15) as an exact F16 pair, by the conversion unit (cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t codes) {
  const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Which words of E4M3 codes the staged one-token expert kernels decode by cvt instead of e4m3x4_to_half2's bit
// operations (quant/staged_moe.cuh, BEAMLINE_CUDA_TOKEN_MOE=staged-cvt and =staged-half-cvt): none, those of an even
// group of four k (k / 4 even; the integer pipes and the conversion unit then share the decoding), or all. A word
// decoded by cvt pairs its codes (0, 1) and (2, 3), by bits (0, 2) and (1, 3); the activation split pairs the
// group's elements alike (activation_split.cuh).
enum class CvtWords { None, Even, All };
__host__ __device__ constexpr bool cvt_word(CvtWords words, int64_t group) {
  return words == CvtWords::All || (words == CvtWords::Even && group % 2 == 0);
}
// The word of k group `group` (a constant once unrolled, so that every lane takes the same path) as the F16 pairs of
// an A fragment's k (2c, 2c + 1) and (2c + 8, 2c + 9).
template <CvtWords kWords>
__device__ __forceinline__ void e4m3_word(uint32_t w, int group, uint32_t& first, uint32_t& second) {
  if (cvt_word(kWords, group)) {
    first = e4m3x2_to_half2(w);
    second = e4m3x2_to_half2(w >> 16);
  } else {
    e4m3x4_to_half2(w, first, second);
  }
}

}  // namespace beamline::cuda
