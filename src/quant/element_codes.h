#pragma once
// Encoders from F32 to the small float formats of the quantized layouts (MODEL_FORMAT.md section 5), and
// table decoders for hot loops. The scalar decoders they invert are tensor/dtype.h's fp8_e4m3_to_f32,
// e8m0_to_f32 and e2m1_to_f32; every encoder here round-trips every finite code of its decoder.
#include <array>
#include <cstdint>

namespace beamline {

inline constexpr float kE4M3Max = 448.0f;  // largest finite OCP E4M3 value (code 0x7e)
inline constexpr float kE2M1Max = 6.0f;    // largest E2M1 magnitude (code 0x7)

// OCP E4M3: round to nearest, ties to even; magnitudes at or above 448 (infinity included) saturate to ±448
// (what hardware's "satfinite" conversion does, so a scale's rounding can never produce NaN); NaN gives the NaN
// code 0x7f with the input's sign. Subnormals (multiples of 2^-9 below 2^-6) are produced; -0 gives 0x80.
uint8_t f32_to_e4m3(float value);

// E2M1 (FP4) into the low 4 bits: round to nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code
// (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); magnitudes above 6 (infinity
// included) saturate to ±6. The format has no NaN: NaN gives 0 (callers refuse non-finite weights first).
// The sign bit (0x8) is set for negative inputs, -0 included.
uint8_t f32_to_e2m1(float value);

// The E8M0 code (biased exponent 2^(code-127)) of the smallest power-of-two scale s with amax / s <= element_max:
// the OCP MX shared scale chosen so the block's largest magnitude fits the element format without clamping
// (OCP's floor(log2(amax)) - emax rule may clamp the largest elements instead; this is the rounding-up choice of
// NVIDIA's MXFP8 recipe). Exact (no rounding in the comparison). The exponent is clamped to [-127, 127]; amax == 0
// gives 127 (scale 1: the block's codes are all zero whatever the scale). amax must be finite and >= 0 and
// element_max > 0.
uint8_t e8m0_for_amax(float amax, float element_max);

// The F32 scale that maps a block's largest magnitude onto E4M3's largest value: max(amax, kMinScaledAmax) / 448.
// The floor (vLLM's per_token_group_quant_fp8 uses the same 1e-10) keeps an all-zero block's scale positive and
// normal, so dividing by it is safe; the block's codes are then all zero whatever the scale.
inline constexpr float kMinScaledAmax = 1e-10f;
float e4m3_scale_for_amax(float amax);

// All 256 E4M3 codes as F32 (fp8_e4m3_to_f32 of each), for decoding in inner loops.
const std::array<float, 256>& e4m3_table();
// All 16 E2M1 codes as F32 (e2m1_to_f32 of each).
const std::array<float, 16>& e2m1_table();

}  // namespace beamline
