#pragma once
// Dynamic FP8 quantization of activations, as W8A8 kernels do it before a block-scaled FP8 GEMM (vLLM's
// per_token_group_quant_fp8 with DeepSeek-V3's 1×128 activation groups): the host definition that device kernels
// are tested against (quantize on the host, dequantize, multiply in FP32).
//
// For each row (token) t and each group g of `group_size` consecutive columns (the last group is cut short when
// columns % group_size != 0):
//   amax  = max |x[t, c]| over the group's columns (NaN elements are skipped, as fmax does)
//   s     = e4m3_scale_for_amax(amax) = max(amax, 1e-10) / 448   (F32; the floor keeps an all-zero group's scale
//           positive and normal, so codes are 0 and dividing is safe — vLLM's choice, so logits match vLLM's)
//   code  = f32_to_e4m3(x / s)   (a true FP32 division, round to nearest even, saturating at ±448)
// A NaN element encodes as NaN; an infinite one makes s infinite and its group's codes NaN (inf/inf) or 0.
// Dequantized: x' = e4m3(code) * s.
#include <cstdint>
#include <span>
#include <vector>

namespace beamline {

inline constexpr int64_t kActivationGroupSize = 128;

struct QuantizedActivations {
  int64_t rows = 0, columns = 0, group_size = kActivationGroupSize;
  std::vector<uint8_t> codes;  // E4M3 [rows, columns]
  std::vector<float> scales;   // F32 [rows, ceil(columns / group_size)], row-major
  int64_t groups_per_row() const { return (columns + group_size - 1) / group_size; }
};

// One row: codes[c] and scales[g] for `columns` values of x (scales holds ceil(columns / group_size) floats).
void quantize_activation_row(const float* x, int64_t columns, int64_t group_size, uint8_t* codes, float* scales);

// The row-major F32 matrix x [rows, columns]. Error when x has another size or group_size <= 0.
QuantizedActivations quantize_activations(std::span<const float> x, int64_t rows, int64_t columns,
                                          int64_t group_size = kActivationGroupSize);
// x' [rows, columns] = e4m3(code) * scale of its group.
std::vector<float> dequantize_activations(const QuantizedActivations& activations);

}  // namespace beamline
