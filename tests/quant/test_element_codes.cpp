// The F32 -> E4M3 / E2M1 / E8M0 encoders against their decoders (tensor/dtype.h) and a brute-force nearest code.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "quant/element_codes.h"
#include "quant_test_support.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline {
namespace {

using testing::nearest_e2m1;
using testing::nearest_e4m3;

TEST(E4M3Encode, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(f32_to_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(code))), code) << "code " << code;
  }
}

TEST(E4M3Encode, KnownValues) {
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(-2.0f), 0xc0);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);   // would round up to 512, which E4M3 lacks: saturates
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);       // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);      // tie between 0 and 2^-9: even (0)
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);      // tie between 1 and 2 (x 2^-9): even (2)
  EXPECT_EQ(f32_to_e4m3(std::ldexp(15.0f, -10)), 0x08);     // tie between 7 * 2^-9 and 2^-6: even (0x08)
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);                    // tie between 1 and 1.125: even mantissa
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);                    // tie between 1.125 and 1.25: even mantissa (1.25)
  EXPECT_EQ(f32_to_e4m3(15.5f), 0x58);                      // tie between 15 and 16: carries into the exponent
}

TEST(E4M3Encode, MatchesBruteForceNearestCode) {
  std::mt19937_64 engine(1);
  std::vector<float> values = testing::wide_values(engine, 20000, -14, 10);
  // Every midpoint between neighbouring codes, and one float either side of it.
  for (int code = 0; code < 0x7e; ++code) {
    const float mid = (fp8_e4m3_to_f32(static_cast<uint8_t>(code)) + fp8_e4m3_to_f32(static_cast<uint8_t>(code + 1))) / 2;
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  for (float v : values) ASSERT_EQ(f32_to_e4m3(v), nearest_e4m3(v)) << "value " << v;
}

TEST(E2M1Encode, EveryCodeRoundTripsAndKnownTies) {
  for (int code = 0; code < 16; ++code)
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(code))), code) << "code " << code;
  const std::pair<float, float> ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                                          {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},  {7.0f, 6.0f}};
  for (auto [value, expected] : ties) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(value)), expected) << value;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-value)), -expected) << -value;
  }
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::infinity()), 0x7);
  EXPECT_EQ(f32_to_e2m1(-1e9f), 0xf);
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0x0);
}

TEST(E2M1Encode, MatchesBruteForceNearestCode) {
  std::mt19937_64 engine(2);
  std::vector<float> values = testing::wide_values(engine, 20000, -3, 3);
  for (int code = 0; code < 7; ++code) {
    const float mid = (e2m1_to_f32(static_cast<uint8_t>(code)) + e2m1_to_f32(static_cast<uint8_t>(code + 1))) / 2;
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 10.0f)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  for (float v : values) ASSERT_EQ(f32_to_e2m1(v), nearest_e2m1(v)) << "value " << v;
}

TEST(E8M0Scale, SmallestPowerOfTwoThatFits) {
  EXPECT_EQ(e8m0_for_amax(448.0f, 448.0f), 127);
  EXPECT_EQ(e8m0_for_amax(std::nextafter(448.0f, 1e9f), 448.0f), 128);
  EXPECT_EQ(e8m0_for_amax(1.0f, 448.0f), 119);  // 1 / 2^-8 = 256 fits, 1 / 2^-9 = 512 does not
  EXPECT_EQ(e8m0_for_amax(0.0f, 448.0f), 127);
  EXPECT_EQ(e8m0_for_amax(1e-45f, 448.0f), 0);  // clamped at 2^-127
  EXPECT_EQ(e8m0_for_amax(std::numeric_limits<float>::max(), 448.0f), 247);
  std::mt19937_64 engine(3);
  for (float v : testing::wide_values(engine, 5000, -100, 100)) {
    const float amax = std::fabs(v);
    const int exponent = e8m0_for_amax(amax, 448.0f) - 127;
    EXPECT_LE(static_cast<double>(amax), std::ldexp(448.0, exponent)) << amax;
    EXPECT_GT(static_cast<double>(amax), std::ldexp(448.0, exponent - 1)) << amax;
  }
  EXPECT_THROW(e8m0_for_amax(std::numeric_limits<float>::quiet_NaN(), 448.0f), Error);
  EXPECT_THROW(e8m0_for_amax(std::numeric_limits<float>::infinity(), 448.0f), Error);
  EXPECT_THROW(e8m0_for_amax(-1.0f, 448.0f), Error);
}

TEST(E4M3Scale, AmaxOver448WithFloor) {
  EXPECT_EQ(e4m3_scale_for_amax(448.0f), 1.0f);
  EXPECT_EQ(e4m3_scale_for_amax(0.0f), kMinScaledAmax / 448.0f);
  EXPECT_GT(e4m3_scale_for_amax(0.0f), 0.0f);
  EXPECT_TRUE(std::isnormal(e4m3_scale_for_amax(0.0f)));
}

TEST(DecodeTables, MatchScalarDecoders) {
  for (int code = 0; code < 256; ++code) {
    const float table = e4m3_table()[static_cast<std::size_t>(code)], scalar = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(scalar)) EXPECT_TRUE(std::isnan(table));
    else EXPECT_EQ(table, scalar);
  }
  for (int code = 0; code < 16; ++code) EXPECT_EQ(e2m1_table()[static_cast<std::size_t>(code)], e2m1_to_f32(static_cast<uint8_t>(code)));
}

}  // namespace
}  // namespace beamline
