#pragma once
// Element types of checkpoint tensors and their scalar codecs (the CPU backend's on-the-fly conversions).
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace beamline {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, F8_E8M0, U8, I32, I64 };

// safetensors spelling ("BF16", "F8_E4M3", ...); nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);
std::string_view dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);  // bytes per stored element (U8 holds two packed FP4 values)

inline float bf16_to_f32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Stores `value` as one element of a float dtype (F32, BF16, F16; rounding to nearest even); Error otherwise.
void store_float(DType dtype, float value, std::byte* out);

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
float fp8_e4m3_to_f32(uint8_t bits);   // OCP E4M3 (no infinities, 0x7f/0xff are NaN)
float e8m0_to_f32(uint8_t bits);       // 2^(bits-127); 0xff is NaN
float e2m1_to_f32(uint8_t nibble);     // FP4: low 4 bits

}  // namespace beamline
