#include "backend/cpu/dequantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define BEAMLINE_CPU_AVX2 1
#endif

#include "quant/element_codes.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline::cpu {
namespace {

#ifdef BEAMLINE_CPU_AVX2
// Eight E4M3 codes times `scale`. A code's exponent and mantissa bits, shifted into an F16's, make the F16 whose value
// is the code's times 2^-8 (E4M3's exponent bias is 7, F16's 15; subnormals included), which widens exactly; times
// scale * 2^8 it is the same real product as e4m3 * scale, so the same float. False, with nothing written, for what
// this cannot carry: a NaN code (0x7f, 0xff), or a scale that overflows when multiplied by 2^8.
bool e4m3_times_8(const uint8_t* codes, float scale, float* out) {
  const float scaled = scale * 256.0f;
  if (std::isinf(scaled) && !std::isinf(scale)) return false;
  const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  const __m128i magnitude = _mm_and_si128(bytes, _mm_set1_epi16(0x7f));
  if (_mm_movemask_epi8(_mm_cmpeq_epi16(magnitude, _mm_set1_epi16(0x7f))) != 0) return false;
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x80)), 8);
  const __m128i half = _mm_or_si128(_mm_slli_epi16(magnitude, 7), sign);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(scaled)));
  return true;
}

// Sixteen E2M1 codes (eight bytes, element 2j in the low nibble of byte j) as (e2m1 * scale) * scale_2.
void e2m1_times_16(const uint8_t* packed, float scale, float scale_2, float* out) {
  const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed));
  const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
  const __m128i nibbles = _mm_unpacklo_epi8(low, high);  // element order
  for (int half = 0; half < 2; ++half) {
    const __m256i code = _mm256_cvtepu8_epi32(half == 0 ? nibbles : _mm_srli_si128(nibbles, 8));
    const __m256 magnitude = _mm256_permutevar8x32_ps(magnitudes, code);  // uses code & 7
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
    const __m256 value = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
    _mm256_storeu_ps(out + 8 * half,
                     _mm256_mul_ps(_mm256_mul_ps(value, _mm256_set1_ps(scale)), _mm256_set1_ps(scale_2)));
  }
}
#endif

// n E4M3 codes times one scale.
void e4m3_run(const uint8_t* codes, int64_t n, float scale, float* out) {
  const std::array<float, 256>& table = e4m3_table();
  int64_t i = 0;
#ifdef BEAMLINE_CPU_AVX2
  for (; i + 8 <= n; i += 8)
    if (!e4m3_times_8(codes + i, scale, out + i))
      for (int64_t j = i; j < i + 8; ++j) out[j] = table[codes[j]] * scale;
#endif
  for (; i < n; ++i) out[i] = table[codes[i]] * scale;
}

// One group of 16 NVFP4 values.
void e2m1_group(const uint8_t* packed, float scale, float scale_2, float* out) {
#ifdef BEAMLINE_CPU_AVX2
  e2m1_times_16(packed, scale, scale_2, out);
#else
  const std::array<float, 16>& table = e2m1_table();
  for (int64_t c = 0; c < kNvfp4GroupSize; c += 2) {
    out[c] = (table[packed[c / 2] & 0xf] * scale) * scale_2;
    out[c + 1] = (table[packed[c / 2] >> 4] * scale) * scale_2;
  }
#endif
}

// e8m0_to_f32 without ldexp: codes 1..254 are exactly the F32 with that biased exponent and no mantissa.
float e8m0_scale(uint8_t code) {
  if (code == 0 || code == 0xff) return e8m0_to_f32(code);  // 2^-127 is subnormal; 0xff is NaN
  const uint32_t bits = uint32_t{code} << 23;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

float read_f32(const uint8_t* bytes, int64_t index) {
  float value;
  std::memcpy(&value, bytes + index * 4, sizeof value);
  return value;
}

}  // namespace

void dequantize_weight_rows(const QuantizedWeightView& weight, int64_t first_row, int64_t count, float* out) {
  const int64_t in = weight.in_features;
  require(first_row >= 0 && count >= 0 && first_row + count <= weight.out_features,
          "dequantize: rows [{}, {}) outside the weight's {} rows", first_row, first_row + count, weight.out_features);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = first_row + i;
    float* y = out + i * in;
    switch (weight.scheme) {
      case QuantScheme::Fp8Block: {
        const int64_t block_columns = (in + kFp8BlockSize - 1) / kFp8BlockSize;
        for (int64_t bc = 0; bc < block_columns; ++bc) {
          const int64_t begin = bc * kFp8BlockSize, end = std::min(in, begin + kFp8BlockSize);
          e4m3_run(weight.codes + row * in + begin, end - begin,
                   read_f32(weight.scales, row / kFp8BlockSize * block_columns + bc), y + begin);
        }
        break;
      }
      case QuantScheme::Mxfp8: {
        const int64_t groups = in / kMxfp8GroupSize;
        for (int64_t g = 0; g < groups; ++g)
          e4m3_run(weight.codes + row * in + g * kMxfp8GroupSize, kMxfp8GroupSize,
                   e8m0_scale(weight.scales[row * groups + g]), y + g * kMxfp8GroupSize);
        break;
      }
      case QuantScheme::Nvfp4: {
        const int64_t groups = in / kNvfp4GroupSize;
        const std::array<float, 256>& e4m3 = e4m3_table();
        for (int64_t g = 0; g < groups; ++g)
          e2m1_group(weight.codes + (row * in + g * kNvfp4GroupSize) / 2, e4m3[weight.scales[row * groups + g]],
                     weight.scale_2, y + g * kNvfp4GroupSize);
        break;
      }
    }
  }
}

}  // namespace beamline::cpu
