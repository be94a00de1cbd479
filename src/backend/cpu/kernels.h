#pragma once
// Inner loops shared by the CPU backend's ops (internal to backend/cpu).
#include <cstddef>
#include <cmath>
#include <cstdint>

#include "backend/backend.h"

namespace beamline::cpu {

// out[0..n) = elements [offset, offset + n) of an F32/F16/BF16/F8_E4M3 buffer, as F32.
void to_f32(const std::byte* data, DType dtype, int64_t offset, int64_t n, float* out);
// Stores F32 values into an F32, BF16 or F8_E4M3 (saturating) buffer at element `offset`.
void from_f32(const float* values, int64_t n, DType dtype, int64_t offset, std::byte* data);

// FP32 dot product; the summation order depends only on n, so a result never depends on batching.
float dot(const float* a, const float* b, int64_t n);

// y[t * y_stride + o] = x[t] · W[o] for t < rows, o < out, with W = weight [out, in] in its stored dtype (a
// quantized weight through its exact dequantization, a few rows at a time; cpu/projection.h) and x rows `in`
// floats apart. Threads over output rows (serially when called inside a pool chunk).
void matmul_wt(const float* x, int64_t rows, const LinearTensors& weight, float* y, int64_t y_stride);

// LoRA over rows of x (`in` floats apart): y[t * y_stride + o] += b[i] (a[i] x[t]) with i = adapters[t], for the rows
// whose adapter is >= 0 (Backend::lora's arithmetic: the rank-R intermediate with dot, then each output with dot, so
// a row's result never depends on the others). Threads over rows (serially when called inside a pool chunk).
void lora_rows(const float* x, int64_t rows, const LoraTensors& lora, const int32_t* adapters, float* y,
               int64_t y_stride);

// The same over a LoraTable (adapters at their own ranks): y[t * y_stride + o] += b_i (a_i x[t]) with i = entries[t]
// for the rows whose entry is >= 0 and whose adapter has a rank; the rank-r_i intermediate with dot, then each output
// with dot. Error naming the row for an entry outside the table or a rank outside [0, max_rank].
void lora_table_rows(const float* x, int64_t rows, const LoraTable& table, const int32_t* entries, float* y,
                     int64_t y_stride);

// out = x / sqrt(mean(x²) + eps) * weight for one row of n values.
void rms_row(const float* x, const Tensor& weight, float eps, int64_t n, float* out);

inline float silu(float a) { return a / (1.0f + std::exp(-a)); }

}  // namespace beamline::cpu
