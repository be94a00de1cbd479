#pragma once
// Projections for few rows: every weight streamed once on the CUDA cores (projection.cu).
// Conventions: backend/cuda/common/operand_precision.h.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/operand_precision.h"
#include "tensor/dtype.h"

namespace beamline::cuda {

// y_s = x W_sᵀ for up to kMaxProjectionWeights weights W_s [out_s, in] (BF16 or F16, 16-byte aligned, all of one
// dtype) and one x [rows, in] F32 (16-byte aligned), y_s [rows, out_s] F32, in one launch that streams every
// weight once and dots it with the F32 rows on the CUDA cores: exact products, FP32 sums, whatever the
// OperandPrecision (decode is bound by the weight bytes, not by arithmetic). softcap > 0 stores
// softcap * tanh(y / softcap) instead. Supported for 1..kMaxProjectionRows rows and `in` a multiple of 8.
constexpr int32_t kMaxProjectionWeights = 4;
constexpr int64_t kMaxProjectionRows = 8;
struct ProjectionBatch {
  const void* weight[kMaxProjectionWeights] = {};
  float* y[kMaxProjectionWeights] = {};
  int64_t out[kMaxProjectionWeights] = {};
  int32_t count = 0;
  DType dtype = DType::BF16;
  int64_t in = 0;
  float softcap = 0.0f;
};
bool projection_supported(DType dtype, int64_t rows, int64_t in);
cudaError_t project_rows(const float* x, int64_t rows, const ProjectionBatch& batch, cudaStream_t stream);

}  // namespace beamline::cuda
