#pragma once
// Weight quantizers for the three layouts of MODEL_FORMAT.md section 5, and their exact dequantization: the
// reference every backend's quantized kernels are tested against (the CPU backend computes with it).
//
// Quantization, per scheme, of an F32 [out, in] matrix (callers convert BF16/F16 first):
//  fp8    per 128×128 block (cut short at the right and bottom edges): s = e4m3_scale_for_amax(block amax)
//         = amax / 448, stored as F32 weight_scale_inv; code = f32_to_e4m3(x / s).
//  mxfp8  per 32 elements of a row: s = 2^(e - 127) with e = e8m0_for_amax(group amax, 448), the smallest power
//         of two that fits the group's largest magnitude into E4M3; stored as E8M0 weight_scale; code =
//         f32_to_e4m3(x / s) (exact scaling).
//  nvfp4  (NVIDIA ModelOpt's recipe) per tensor: s2 = max(amax, kMinScaledAmax) / (448 * 6), the F32
//         weight_scale_2; per 16 elements of a row: b = f32_to_e4m3(group amax / (6 * s2)), the E4M3
//         weight_scale; code = f32_to_e2m1(x / (b * s2)), or 0 where b decodes to 0 (a group too small for the
//         scale's range). Codes pack two per byte, element 2j in the low nibble of byte j.
// Dequantization (the reference, in FP32): fp8 W = e4m3(code) * s; mxfp8 W = e4m3(code) * 2^(e - 127);
// nvfp4 W = (e2m1(code) * e4m3(b)) * s2 — in that order (the first product is exact, so the one rounding is
// the multiply by s2; a kernel that multiplies in another order may differ by one ulp).
#include <cstdint>
#include <span>
#include <vector>

#include "quant/quant_scheme.h"

namespace beamline {

// Non-owning view of one quantized weight's stored bytes (mmap'd, or host copies), as quant_layout describes.
struct QuantizedWeightView {
  QuantScheme scheme = QuantScheme::Fp8Block;
  int64_t out_features = 0, in_features = 0;  // of the logical [out, in] matrix
  const uint8_t* codes = nullptr;             // X.weight
  const uint8_t* scales = nullptr;            // X.weight_scale_inv (F32, little-endian) or X.weight_scale
  float scale_2 = 1.0f;                       // X.weight_scale_2 (nvfp4; ignored otherwise)
};

// One quantized weight, owning its bytes: `codes` and `scales` are exactly the bytes of the stored tensors.
struct QuantizedWeight {
  QuantScheme scheme = QuantScheme::Fp8Block;
  int64_t out_features = 0, in_features = 0;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  float scale_2 = 1.0f;
  QuantizedWeightView view() const { return {scheme, out_features, in_features, codes.data(), scales.data(), scale_2}; }
};

// The largest magnitude of `values` (the tensor amax that nvfp4's weight_scale_2 is made from). Error naming the
// index of the first NaN or infinity: a non-finite weight has no quantization.
float weight_amax(std::span<const float> values);
// nvfp4's weight_scale_2 for a tensor whose amax is `tensor_amax`.
float nvfp4_scale_2(float tensor_amax);

// Quantizes the row-major F32 matrix `values` [out_features, in_features]. Error when the shape does not fit the
// scheme (quant_layout), `values` has another size, or a value is not finite (naming its row and column).
QuantizedWeight quantize_weight(QuantScheme scheme, std::span<const float> values, int64_t out_features,
                                int64_t in_features);

// Rows [r, r + rows) of a larger matrix, for writers that stream a tensor in bands: with r a multiple of
// quant_row_granularity(scheme) and `tensor_amax` the whole matrix's weight_amax, the result's codes and scales
// are exactly the bytes of the whole matrix's quantization that belong to these rows (whole scale rows: for fp8
// scale rows r/128 .. ceil((r + rows)/128) - 1), and scale_2 is the whole matrix's. `values` holds rows × in.
QuantizedWeight quantize_weight_rows(QuantScheme scheme, std::span<const float> values, int64_t rows,
                                     int64_t in_features, float tensor_amax);

// out[i * in + c] = W[first_row + i, c] for i < count: the exact dequantization above. Rows must be inside the
// weight; `out` holds count × in_features floats.
void dequantize_rows(const QuantizedWeightView& weight, int64_t first_row, int64_t count, float* out);
// The whole [out, in] matrix.
std::vector<float> dequantize_weight(const QuantizedWeightView& weight);

}  // namespace beamline
