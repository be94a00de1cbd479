#pragma once
// Elementwise and per-row kernels: embedding, norms, rotary, SSMax, activation splitting, soft-cap, random fill (rows.cu).
// Conventions: backend/cuda/common/operand_precision.h.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/operand_precision.h"
#include "tensor/dtype.h"

namespace beamline::cuda {

// tokens[pairs[2j]] = source[pairs[2j + 1]] for j < num_pairs (pairs validated on the host).
cudaError_t place_tokens(const int32_t* source, const int32_t* pairs, int64_t num_pairs, int32_t* tokens,
                         cudaStream_t stream);
// Token ids outside [0, vocab) give NaN rows (validated on the host beforehand).
cudaError_t embedding(const void* table, DType table_dtype, int64_t vocab, const int32_t* tokens, int64_t rows,
                      int64_t hidden, float* out, cudaStream_t stream);
cudaError_t rms_norm(const float* x, const void* weight, DType weight_dtype, float eps, int64_t rows, int64_t hidden,
                     float* out, cudaStream_t stream);
// residual += scale * rms(y, weight)
cudaError_t add_rms_norm(float* residual, const float* y, const void* weight, DType weight_dtype, float eps,
                         float scale, int64_t rows, int64_t hidden, cudaStream_t stream);
// add_rms_norm(residual, y, weight) then out = rms(residual, next_weight), one pass (weights of one dtype).
cudaError_t add_rms_norm_then_norm(float* residual, const float* y, const void* weight, const void* next_weight,
                                   DType weight_dtype, float eps, float scale, int64_t rows, int64_t hidden,
                                   float* out, cudaStream_t stream);
// out[i] = rms(x[rows[i]], weight) stored as `out_dtype` (BF16/F16/F32), the input of the LM head GEMM; a row
// outside the x_rows rows of x gives NaN.
cudaError_t gather_rms_norm(const float* x, int64_t x_rows, const int32_t* rows, int64_t selected, const void* weight,
                            DType weight_dtype, float eps, int64_t hidden, void* out, DType out_dtype,
                            cudaStream_t stream);
// NeoX RoPE in place over q [rows, q_heads * head_dim] and k [rows, k_heads * head_dim] in one launch (k_heads 0: q
// alone, k unused).
cudaError_t rope(float* q, int32_t q_heads, float* k, int32_t k_heads, const int32_t* positions, int64_t rows,
                 int32_t head_dim, float theta, cudaStream_t stream);
cudaError_t ssmax_scale(float* q, const int32_t* positions, int64_t rows, int64_t width, float base, float exponent,
                        cudaStream_t stream);
// F32 activations as `terms` tensor-core operand row sets in `dtype` (BF16 or F16), set t at out + t n: kSplitTerms
// (OperandPrecision::Split) gives common/split_operand.cuh's hi, lo, lo2, which sum to x exactly in BF16 (|x| >=
// 2^-110), so a GEMM over the rows [hi; lo; lo2] followed by add_terms multiplies F32 activations by BF16 weights as
// FP32 arithmetic does, where a single rounding to BF16 errs by up to 2^-9 relative — the difference between matching
// the CPU backend's argmax everywhere and at 97%. 1 (OperandPrecision::Bf16) gives that single rounding.
cudaError_t split_f32(const float* in, int64_t n, void* out, int terms, DType dtype, cudaStream_t stream);
// out[i] = the sum of the kSplitTerms products partials[t n + i] of split_f32's operands, smallest (lo2) first.
cudaError_t add_terms(const float* partials, int64_t n, float* out, cudaStream_t stream);
// gate[i] = silu(gate[i]) * up[i] in place: the dense MLP's activation between its GEMMs.
cudaError_t silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);
// x = cap * tanh(x / cap) in place.
cudaError_t soft_cap(float* x, int64_t n, float cap, cudaStream_t stream);
// normal_value(key, i, mean, stddev) (util/counter_random.h) stored as `dtype` (F32, F16, BF16): on-device random
// weights, the same bytes as the CPU backend's and make-model's.
cudaError_t fill_random(void* out, DType dtype, int64_t n, uint64_t key, float mean, float stddev, cudaStream_t stream);

}  // namespace beamline::cuda
