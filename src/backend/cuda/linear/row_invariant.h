#pragma once
// Projections whose every output is computed the same way whatever the number of rows (--batch-invariant): one
// kernel configuration for all row counts (row_invariant.cu).
// Conventions: backend/cuda/common/operand_precision.h.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace beamline::cuda {

// y = x Wᵀ (softcap > 0: softcap * tanh(y / softcap)) for x [rows, in] F32, W [out, in] BF16, F16 or F32, y [rows, out]
// F32. Each output is one lane-strided chain of FP32 fused multiply-adds over k in a fixed order, then a fixed warp
// reduction: no split-K, no tensor cores, no rounding of the activations, and tiles of rows that only decide which
// outputs a block writes, so a row's outputs are bit-identical whether it comes alone or among any number of rows.
// Any `in` and alignment (16-byte loads where both operands allow them; the arithmetic is the same either way).
cudaError_t project_row_invariant(const float* x, int64_t rows, const void* weight, DType dtype, int64_t in,
                                  int64_t out, float softcap, float* y, cudaStream_t stream);

}  // namespace beamline::cuda
