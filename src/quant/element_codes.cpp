#include "quant/element_codes.h"

#include <cmath>
#include <cstring>

#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline {

uint8_t f32_to_e4m3(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t magnitude_bits = bits & 0x7fffffffu;
  if (magnitude_bits > 0x7f800000u) return sign | 0x7f;
  const float magnitude = std::fabs(value);
  if (magnitude >= kE4M3Max) return sign | 0x7e;
  constexpr float kSmallestNormal = 0.015625f;  // 2^-6
  if (magnitude < kSmallestNormal) {
    // Subnormal codes are m * 2^-9: scaling by 2^9 is exact, nearbyint rounds to even. m == 8 is code 0x08,
    // the smallest normal, so the carry needs no special case.
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f));
  }
  // Keep the exponent and 3 mantissa bits, rounding the 20 dropped bits to nearest even; a carry out of the
  // mantissa bumps the exponent, which is the right result. Rebias the exponent from 127 to 7.
  const uint32_t rounded = magnitude_bits + 0x7ffffu + ((magnitude_bits >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120u << 3));
}

uint8_t f32_to_e2m1(float value) {
  const uint8_t sign = std::signbit(value) ? 0x8 : 0x0;
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return 0;
  // Upper bounds of each code's rounding interval; a tie goes to the even code, so even codes own both ends.
  uint8_t code;
  if (magnitude <= 0.25f) code = 0;
  else if (magnitude < 0.75f) code = 1;
  else if (magnitude <= 1.25f) code = 2;
  else if (magnitude < 1.75f) code = 3;
  else if (magnitude <= 2.5f) code = 4;
  else if (magnitude < 3.5f) code = 5;
  else if (magnitude <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

uint8_t e8m0_for_amax(float amax, float element_max) {
  require(std::isfinite(amax) && amax >= 0.0f, "e8m0_for_amax: amax {} must be finite and >= 0", amax);
  require(element_max > 0.0f, "e8m0_for_amax: element_max {} must be > 0", element_max);
  if (amax == 0.0f) return 127;
  // amax = f * 2^k and element_max = g * 2^j with f, g in [0.5, 1): amax / 2^x <= element_max holds for
  // x = k - j when f <= g, and needs one more power of two otherwise.
  int k, j;
  const float f = std::frexp(amax, &k), g = std::frexp(element_max, &j);
  int exponent = k - j + (f <= g ? 0 : 1);
  if (exponent < -127) exponent = -127;
  if (exponent > 127) exponent = 127;
  return static_cast<uint8_t>(exponent + 127);
}

float e4m3_scale_for_amax(float amax) { return std::fmax(amax, kMinScaledAmax) / kE4M3Max; }

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int code = 0; code < 256; ++code) values[static_cast<std::size_t>(code)] = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
    return values;
  }();
  return table;
}

const std::array<float, 16>& e2m1_table() {
  static const std::array<float, 16> table = [] {
    std::array<float, 16> values{};
    for (int code = 0; code < 16; ++code) values[static_cast<std::size_t>(code)] = e2m1_to_f32(static_cast<uint8_t>(code));
    return values;
  }();
  return table;
}

}  // namespace beamline
