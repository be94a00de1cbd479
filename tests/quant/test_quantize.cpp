// The weight quantizers of MODEL_FORMAT.md section 5 and their dequantization: layouts, exact known values,
// scales recomputed from the definition, every code the nearest to its scaled value (brute force), edge blocks,
// bands of rows equal to slices of the whole, zero / NaN / saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "quant/element_codes.h"
#include "quant/quantize.h"
#include "quant_test_support.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline {
namespace {

using testing::nearest_e2m1;
using testing::nearest_e4m3;

std::vector<float> random_matrix(uint64_t seed, int64_t out, int64_t in) {
  std::mt19937_64 engine(seed);
  std::vector<float> values = testing::wide_values(engine, static_cast<std::size_t>(out * in), -3, 1);
  return values;
}

float fp8_scale(const QuantizedWeight& q, int64_t block_row, int64_t block_column) {
  const int64_t columns = (q.in_features + 127) / 128;
  float scale;
  std::memcpy(&scale, q.scales.data() + (block_row * columns + block_column) * 4, 4);
  return scale;
}

float amax_of(const std::vector<float>& w, int64_t in, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[static_cast<std::size_t>(r * in + c)]));
  return amax;
}

uint8_t nvfp4_code(const QuantizedWeight& q, int64_t r, int64_t c) {
  const uint8_t byte = q.codes[static_cast<std::size_t>((r * q.in_features + c) / 2)];
  return c % 2 == 0 ? byte & 0xf : byte >> 4;
}

TEST(QuantLayout, ShapesAndDtypesPerScheme) {
  const QuantLayout fp8 = quant_layout(QuantScheme::Fp8Block, 300, 200);
  EXPECT_EQ(fp8.weight_dtype, DType::F8_E4M3);
  EXPECT_EQ(fp8.weight_shape, (std::vector<int64_t>{300, 200}));
  EXPECT_EQ(fp8.scale_suffix, "weight_scale_inv");
  EXPECT_EQ(fp8.scale_dtype, DType::F32);
  EXPECT_EQ(fp8.scale_shape, (std::vector<int64_t>{3, 2}));
  EXPECT_FALSE(fp8.has_scale_2);
  const QuantLayout mx = quant_layout(QuantScheme::Mxfp8, 7, 96);
  EXPECT_EQ(mx.weight_shape, (std::vector<int64_t>{7, 96}));
  EXPECT_EQ(mx.scale_dtype, DType::F8_E8M0);
  EXPECT_EQ(mx.scale_shape, (std::vector<int64_t>{7, 3}));
  const QuantLayout nv = quant_layout(QuantScheme::Nvfp4, 7, 48);
  EXPECT_EQ(nv.weight_dtype, DType::U8);
  EXPECT_EQ(nv.weight_shape, (std::vector<int64_t>{7, 24}));
  EXPECT_EQ(nv.scale_suffix, "weight_scale");
  EXPECT_EQ(nv.scale_dtype, DType::F8_E4M3);
  EXPECT_EQ(nv.scale_shape, (std::vector<int64_t>{7, 3}));
  EXPECT_TRUE(nv.has_scale_2);
  try {
    quant_layout(QuantScheme::Mxfp8, 4, 48);
    FAIL() << "in_features 48 accepted for mxfp8";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("divisible by 32"), std::string::npos) << error.what();
  }
  EXPECT_THROW(quant_layout(QuantScheme::Nvfp4, 4, 40), Error);
  EXPECT_THROW(quant_layout(QuantScheme::Fp8Block, 0, 128), Error);
}

TEST(QuantScheme, NamesAndMethods) {
  for (QuantScheme scheme : {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4}) {
    EXPECT_EQ(quant_scheme_from_name(quant_scheme_name(scheme)), scheme);
    EXPECT_EQ(quant_scheme_from_method(quant_method_of(scheme), quant_algo_of(scheme)), scheme);
  }
  EXPECT_EQ(quant_scheme_from_method("modelopt", "NVFP4"), QuantScheme::Nvfp4);
  EXPECT_EQ(quant_scheme_from_method("modelopt", "FP8"), std::nullopt);
  EXPECT_EQ(quant_scheme_from_name("int4"), std::nullopt);
}

TEST(QuantizeFp8, KnownValues) {
  const std::vector<float> w = {448.0f, -224.0f, 1.0f, 0.0f};
  const QuantizedWeight q = quantize_weight(QuantScheme::Fp8Block, w, 1, 4);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x7e, 0xf6, 0x38, 0x00}));
  EXPECT_EQ(fp8_scale(q, 0, 0), 1.0f);
  EXPECT_EQ(dequantize_weight(q.view()), w);
}

TEST(QuantizeFp8, EdgeBlocksScalesAndNearestCodes) {
  const int64_t out = 300, in = 200;  // blocks cut by the edge in both directions
  std::vector<float> w = random_matrix(10, out, in);
  w[static_cast<std::size_t>(299 * in + 199)] = 50.0f;  // the corner block's amax
  const QuantizedWeight q = quantize_weight(QuantScheme::Fp8Block, w, out, in);
  ASSERT_EQ(q.codes.size(), static_cast<std::size_t>(out * in));
  ASSERT_EQ(q.scales.size(), 3u * 2u * 4u);
  EXPECT_EQ(fp8_scale(q, 2, 1), 50.0f / 448.0f);
  const std::vector<float> back = dequantize_weight(q.view());
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) {
      const int64_t br = r / 128, bc = c / 128;
      const float amax = amax_of(w, in, br * 128, std::min(out, br * 128 + 128), bc * 128, std::min(in, bc * 128 + 128));
      const float scale = fp8_scale(q, br, bc);
      ASSERT_EQ(scale, amax / 448.0f) << "block " << br << "," << bc;
      const auto i = static_cast<std::size_t>(r * in + c);
      ASSERT_EQ(q.codes[i], nearest_e4m3(w[i] / scale)) << r << "," << c;
      ASSERT_EQ(back[i], fp8_e4m3_to_f32(q.codes[i]) * scale);
      // The element of largest magnitude lands on ±448 (up to the one rounding of the scale).
      if (std::fabs(w[i]) == amax) {
        ASSERT_EQ(q.codes[i] & 0x7f, 0x7e);
      }
    }
}

TEST(QuantizeMxfp8, KnownValues) {
  std::vector<float> w(64, 0.0f);
  w[0] = 1.0f;     // group 0: amax 1 -> scale 2^-8, code of 256
  w[1] = -0.5f;
  w[32] = 448.0f;  // group 1: amax 448 -> scale 1
  w[33] = 3.0f;
  const QuantizedWeight q = quantize_weight(QuantScheme::Mxfp8, w, 1, 64);
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{119, 127}));
  EXPECT_EQ(q.codes[0], 0x78);
  EXPECT_EQ(q.codes[1], 0xf0);
  EXPECT_EQ(q.codes[32], 0x7e);
  EXPECT_EQ(q.codes[33], 0x44);
  EXPECT_EQ(dequantize_weight(q.view()), w);
}

TEST(QuantizeMxfp8, ScalesFitAndNearestCodes) {
  const int64_t out = 37, in = 96;
  const std::vector<float> w = random_matrix(11, out, in);
  const QuantizedWeight q = quantize_weight(QuantScheme::Mxfp8, w, out, in);
  const std::vector<float> back = dequantize_weight(q.view());
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g < in / 32; ++g) {
      const uint8_t e = q.scales[static_cast<std::size_t>(r * 3 + g)];
      ASSERT_EQ(e, e8m0_for_amax(amax_of(w, in, r, r + 1, g * 32, g * 32 + 32), 448.0f));
      const float scale = e8m0_to_f32(e);
      for (int64_t c = g * 32; c < g * 32 + 32; ++c) {
        const auto i = static_cast<std::size_t>(r * in + c);
        ASSERT_EQ(q.codes[i], nearest_e4m3(w[i] / scale)) << r << "," << c;
        ASSERT_EQ(back[i], fp8_e4m3_to_f32(q.codes[i]) * scale);
      }
    }
}

TEST(QuantizeNvfp4, KnownValues) {
  // amax 6: weight_scale_2 = 6 / 2688 and the group scale 6 / (6 * weight_scale_2) = 448, so the codes are the
  // values themselves.
  const std::vector<float> w = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0};
  const QuantizedWeight q = quantize_weight(QuantScheme::Nvfp4, w, 1, 16);
  EXPECT_EQ(q.scale_2, 6.0f / 2688.0f);
  EXPECT_EQ(q.scales, (std::vector<uint8_t>{0x7e}));
  for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_f32(nvfp4_code(q, 0, c)), w[static_cast<std::size_t>(c)]) << c;
  EXPECT_EQ(q.codes[0], 0x10);  // element 0 (code 0) in the low nibble, element 1 (0.5: code 1) in the high one
  const std::vector<float> back = dequantize_weight(q.view());
  for (std::size_t c = 0; c < 16; ++c) EXPECT_EQ(back[c], (w[c] * 448.0f) * q.scale_2) << c;
}

TEST(QuantizeNvfp4, ScalesAndNearestCodes) {
  const int64_t out = 23, in = 80;
  const std::vector<float> w = random_matrix(12, out, in);
  const QuantizedWeight q = quantize_weight(QuantScheme::Nvfp4, w, out, in);
  ASSERT_EQ(q.codes.size(), static_cast<std::size_t>(out * in / 2));
  EXPECT_EQ(q.scale_2, amax_of(w, in, 0, out, 0, in) / 2688.0f);
  const std::vector<float> back = dequantize_weight(q.view());
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g < in / 16; ++g) {
      const uint8_t scale_code = q.scales[static_cast<std::size_t>(r * 5 + g)];
      ASSERT_EQ(scale_code, nearest_e4m3(amax_of(w, in, r, r + 1, g * 16, g * 16 + 16) / (6.0f * q.scale_2)));
      const float scale = fp8_e4m3_to_f32(scale_code);
      for (int64_t c = g * 16; c < g * 16 + 16; ++c) {
        const auto i = static_cast<std::size_t>(r * in + c);
        ASSERT_EQ(nvfp4_code(q, r, c), nearest_e2m1(w[i] / (scale * q.scale_2))) << r << "," << c;
        ASSERT_EQ(back[i], (e2m1_to_f32(nvfp4_code(q, r, c)) * scale) * q.scale_2);
      }
    }
}

TEST(QuantizeNvfp4, GroupScaleRoundedDownSaturatesTheCode) {
  // Group 0 sets the tensor amax 2.625 = 2688 * 2^-10, so weight_scale_2 is exactly 2^-10. Group 1's amax
  // 17 * 6 * 2^-10 asks for a group scale of exactly 17, which E4M3 rounds (a tie, to even) down to 16: its
  // largest element becomes 17 * 6 / 16 = 6.375 and saturates to 6.
  std::vector<float> w(32, 0.0f);
  w[0] = 2.625f;
  w[16] = 17.0f * 6.0f / 1024.0f;
  const QuantizedWeight q = quantize_weight(QuantScheme::Nvfp4, w, 1, 32);
  ASSERT_EQ(q.scale_2, 1.0f / 1024.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(q.scales[1]), 16.0f);
  EXPECT_EQ(nvfp4_code(q, 0, 16), 0x7);
  EXPECT_EQ(dequantize_weight(q.view())[16], 6.0f * 16.0f / 1024.0f);
}

TEST(QuantizeWeight, BandsOfRowsEqualSlicesOfTheWhole) {
  const int64_t out = 300, in = 128;
  const std::vector<float> w = random_matrix(13, out, in);
  for (QuantScheme scheme : {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4}) {
    const QuantizedWeight whole = quantize_weight(scheme, w, out, in);
    const float amax = weight_amax(w);
    const int64_t band = scheme == QuantScheme::Fp8Block ? 128 : 7;
    std::vector<uint8_t> codes, scales;
    for (int64_t r = 0; r < out; r += band) {
      const int64_t rows = std::min(band, out - r);
      const QuantizedWeight part = quantize_weight_rows(
          scheme, std::span<const float>(w).subspan(static_cast<std::size_t>(r * in), static_cast<std::size_t>(rows * in)),
          rows, in, amax);
      EXPECT_EQ(part.scale_2, whole.scale_2);
      codes.insert(codes.end(), part.codes.begin(), part.codes.end());
      scales.insert(scales.end(), part.scales.begin(), part.scales.end());
    }
    EXPECT_EQ(codes, whole.codes) << quant_scheme_name(scheme);
    EXPECT_EQ(scales, whole.scales) << quant_scheme_name(scheme);
  }
}

TEST(QuantizeWeight, ZeroWeightGivesZeroCodesAndPositiveScales) {
  const std::vector<float> w(2 * 32, 0.0f);
  for (QuantScheme scheme : {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4}) {
    const QuantizedWeight q = quantize_weight(scheme, w, 2, 32);
    for (uint8_t code : q.codes) EXPECT_EQ(code, 0) << quant_scheme_name(scheme);
    EXPECT_GT(q.scale_2, 0.0f);
    for (float v : dequantize_weight(q.view())) EXPECT_EQ(v, 0.0f) << quant_scheme_name(scheme);
  }
  EXPECT_GT(fp8_scale(quantize_weight(QuantScheme::Fp8Block, w, 2, 32), 0, 0), 0.0f);
}

TEST(QuantizeWeight, NonFiniteAndBadShapesAreRefused) {
  std::vector<float> w(2 * 32, 1.0f);
  w[32 + 5] = std::numeric_limits<float>::quiet_NaN();
  for (QuantScheme scheme : {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4}) {
    try {
      quantize_weight(scheme, w, 2, 32);
      FAIL() << "NaN accepted by " << quant_scheme_name(scheme);
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("[1, 5]"), std::string::npos) << error.what();
    }
  }
  w[32 + 5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_weight(QuantScheme::Fp8Block, w, 2, 32), Error);
  EXPECT_THROW(quantize_weight(QuantScheme::Fp8Block, std::vector<float>(10), 2, 32), Error);
  EXPECT_THROW(quantize_weight(QuantScheme::Nvfp4, std::vector<float>(2 * 24), 2, 24), Error);
  const QuantizedWeight q = quantize_weight(QuantScheme::Mxfp8, std::vector<float>(64, 1.0f), 2, 32);
  std::vector<float> row(32);
  EXPECT_THROW(dequantize_rows(q.view(), 2, 1, row.data()), Error);
}

TEST(QuantizeWeight, ErrorWithinHalfAStepOfEachFormat) {
  // A sanity bound on top of the nearest-code checks: relative to the block's amax, fp8 and mxfp8 keep 3
  // mantissa bits (error <= amax * 2^-4 per element at most) and nvfp4 about one E2M1 step (amax / 6 / 2 * 2).
  const int64_t out = 64, in = 256;
  const std::vector<float> w = random_matrix(14, out, in);
  const float amax = weight_amax(w);
  const std::pair<QuantScheme, double> bounds[] = {
      {QuantScheme::Fp8Block, 1.0 / 16}, {QuantScheme::Mxfp8, 1.0 / 16}, {QuantScheme::Nvfp4, 1.0 / 3}};
  for (auto [scheme, bound] : bounds) {
    const std::vector<float> back = dequantize_weight(quantize_weight(scheme, w, out, in).view());
    for (std::size_t i = 0; i < w.size(); ++i)
      ASSERT_LE(std::fabs(back[i] - w[i]), bound * amax) << quant_scheme_name(scheme) << " element " << i;
  }
}

}  // namespace
}  // namespace beamline
