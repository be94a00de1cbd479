#include "tensor/dtype.h"

#include <cmath>
#include <limits>

#include "util/error.h"

namespace beamline {
namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2},         {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1}, {DType::U8, "U8", 1},
    {DType::I32, "I32", 4},         {DType::I64, "I64", 8},
};
}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

std::size_t dtype_size(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

float f16_to_f32(uint16_t bits) {
  const int sign = (bits >> 15) & 1, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  return sign ? -magnitude : magnitude;
}

uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00;
  if (magnitude >= 65520.0f) return sign | 0x7c00;
  if (magnitude < 6.103515625e-05f) {  // subnormal: multiples of 2^-24, round to nearest even
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t mag_bits = bits & 0x7fffffffu;
  mag_bits += 0xfffu + ((mag_bits >> 13) & 1u);
  return sign | static_cast<uint16_t>(((mag_bits >> 13) - (112u << 10)) & 0x7fff);
}

float fp8_e4m3_to_f32(uint8_t bits) {
  const int sign = bits >> 7, exponent = (bits >> 3) & 0xf, mantissa = bits & 7;
  if (exponent == 0xf && mantissa == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(static_cast<float>(mantissa | 8), exponent - 10);
  return sign ? -magnitude : magnitude;
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float magnitude = kValues[nibble & 7];
  return (nibble & 8) ? -magnitude : magnitude;
}

void store_float(DType dtype, float value, std::byte* out) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, &value, sizeof value);
      return;
    case DType::BF16: {
      const uint16_t bits = f32_to_bf16(value);
      std::memcpy(out, &bits, sizeof bits);
      return;
    }
    case DType::F16: {
      const uint16_t bits = f32_to_f16(value);
      std::memcpy(out, &bits, sizeof bits);
      return;
    }
    default:
      fail("cannot store floats as {}", dtype_name(dtype));
  }
}

}  // namespace beamline
