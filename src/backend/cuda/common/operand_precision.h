#pragma once
// Launchers of the CUDA backend's kernels (internal to backend/cuda), one header per family. They take raw device
// pointers and sizes that the backend has already validated, enqueue on `stream` and return the launch's error
// code, so each kernel can be replaced (the performance work) without touching the backend's checks or the model.
// Float buffers whose element type varies (weights, the KV pool) come as void* with their DType.

namespace beamline::cuda {

// How the compute-bound kernels feed F32 activations to the tensor cores (Backend::compute_dtype): Split = the
// kSplitTerms BF16 operands hi + lo + lo2 of common/split_operand.cuh (exact for |x| >= 2^-110, so products are what
// FP32 arithmetic gives; three MMAs per product), Bf16 = one rounding to BF16 (one MMA). Kernels bound by memory read
// F32 as it is whatever this says.
enum class OperandPrecision { Split, Bf16 };
constexpr int kSplitTerms = 3;

// 16-bit operand rows per F32 activation row.
constexpr int operand_terms(OperandPrecision precision) {
  return precision == OperandPrecision::Split ? kSplitTerms : 1;
}

}  // namespace beamline::cuda
