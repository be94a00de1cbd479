// Per-token, per-128-channel dynamic FP8 activation quantization (quant/activation_quant.h): scales from the
// definition, every code the nearest to x / scale (brute force), the partial last group, zero and NaN groups.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "quant/activation_quant.h"
#include "quant_test_support.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline {
namespace {

TEST(ActivationQuant, KnownValues) {
  std::vector<float> x(128, 0.0f);
  x[0] = 448.0f;
  x[1] = -1.0f;
  x[2] = 0.5f;
  const QuantizedActivations q = quantize_activations(x, 1, 128);
  ASSERT_EQ(q.scales, std::vector<float>{1.0f});
  EXPECT_EQ(q.codes[0], 0x7e);
  EXPECT_EQ(q.codes[1], 0xb8);
  EXPECT_EQ(q.codes[2], 0x30);
  EXPECT_EQ(q.codes[3], 0x00);
  EXPECT_EQ(dequantize_activations(q), x);
}

TEST(ActivationQuant, ScalesAndNearestCodesWithAPartialLastGroup) {
  const int64_t rows = 5, columns = 200;  // groups of 128 and 72 columns
  std::mt19937_64 engine(20);
  const std::vector<float> x = testing::wide_values(engine, static_cast<std::size_t>(rows * columns), -6, 4);
  const QuantizedActivations q = quantize_activations(x, rows, columns);
  ASSERT_EQ(q.groups_per_row(), 2);
  ASSERT_EQ(q.scales.size(), 10u);
  const std::vector<float> back = dequantize_activations(q);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t g = 0; g < 2; ++g) {
      const int64_t first = g * 128, end = std::min<int64_t>(columns, first + 128);
      float amax = 0.0f;
      for (int64_t c = first; c < end; ++c) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(t * columns + c)]));
      const float scale = q.scales[static_cast<std::size_t>(t * 2 + g)];
      ASSERT_EQ(scale, amax / 448.0f) << t << "," << g;
      for (int64_t c = first; c < end; ++c) {
        const auto i = static_cast<std::size_t>(t * columns + c);
        ASSERT_EQ(q.codes[i], testing::nearest_e4m3(x[i] / scale)) << t << "," << c;
        ASSERT_EQ(back[i], fp8_e4m3_to_f32(q.codes[i]) * scale);
      }
    }
}

TEST(ActivationQuant, RowHelperMatchesTheMatrixFunction) {
  std::mt19937_64 engine(21);
  const std::vector<float> x = testing::wide_values(engine, 3 * 96, -2, 2);
  const QuantizedActivations q = quantize_activations(x, 3, 96, 32);
  std::vector<uint8_t> codes(96);
  std::vector<float> scales(3);
  quantize_activation_row(x.data() + 96, 96, 32, codes.data(), scales.data());
  EXPECT_EQ(codes, std::vector<uint8_t>(q.codes.begin() + 96, q.codes.begin() + 192));
  EXPECT_EQ(scales, std::vector<float>(q.scales.begin() + 3, q.scales.begin() + 6));
}

TEST(ActivationQuant, ZeroGroupHasAPositiveScaleAndZeroCodes) {
  const QuantizedActivations q = quantize_activations(std::vector<float>(256, 0.0f), 2, 128);
  for (float scale : q.scales) {
    EXPECT_EQ(scale, 1e-10f / 448.0f);
    EXPECT_TRUE(std::isnormal(scale));
  }
  for (uint8_t code : q.codes) EXPECT_EQ(code, 0);
}

TEST(ActivationQuant, NanStaysInItsElementAndBadShapesAreRefused) {
  std::vector<float> x(128, 0.0f);
  x[0] = 2.0f;
  x[7] = std::numeric_limits<float>::quiet_NaN();
  const QuantizedActivations q = quantize_activations(x, 1, 128);
  EXPECT_EQ(q.scales[0], 2.0f / 448.0f);  // the NaN does not poison the group's amax
  EXPECT_EQ(q.codes[0], 0x7e);
  EXPECT_EQ(q.codes[7] & 0x7f, 0x7f);
  EXPECT_THROW(quantize_activations(x, 2, 128), Error);
  EXPECT_THROW(quantize_activations(x, 1, 128, 0), Error);
}

}  // namespace
}  // namespace beamline
