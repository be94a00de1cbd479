#pragma once
// A projection weight as the CPU backend reads it (internal to backend/cpu): its logical [out, in] and, for the
// quantized layouts of docs/model-format.md §5, the view that quant/quantize.h's exact dequantization reads.
#include <cstdint>
#include <optional>
#include <string_view>

#include "backend/backend.h"
#include "quant/quantize.h"

namespace beamline::cpu {

struct Projection {
  int64_t out = 0, in = 0;                      // of the logical matrix (NVFP4 stores in/2 bytes per row)
  std::optional<QuantizedWeightView> quantized;  // nullopt: an F32, BF16 or F16 weight
};

// Recognises the layout by its dtypes — F32/BF16/F16 with no scale; FP8 block-128 (E4M3 + F32 scale); MXFP8
// (E4M3 + E8M0 or U8 scale); NVFP4 (U8 + E4M3 scale + F32 scale_2 []) — and checks that every scale tensor has the
// shape the layout needs for the weight's shape. Error naming the op, `what`, and the expected dtype or shape.
Projection projection(const LinearTensors& weight, std::string_view op, std::string_view what);

}  // namespace beamline::cpu
