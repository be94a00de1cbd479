#pragma once
// The CPU backend's dequantization of quantized weight rows (internal to backend/cpu): quant/quantize.h's
// dequantize_rows, equal to it bit for bit, eight values at a time with AVX2 + F16C where the build has them (the
// scalar table loop made a decode step three times slower than on BF16 weights).
#include <cstdint>

#include "quant/quantize.h"

namespace beamline::cpu {

// out[i * in + c] = W[first_row + i, c] for i < count, exactly as beamline::dequantize_rows computes it.
void dequantize_weight_rows(const QuantizedWeightView& weight, int64_t first_row, int64_t count, float* out);

}  // namespace beamline::cpu
