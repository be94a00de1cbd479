// Per-row and elementwise kernels: token placement, embedding, RMSNorm (plain, fused residual add, gathered for the
// LM head), RoPE, SSMax, dtype conversion, soft-cap, random and poison fills.
#include <algorithm>
#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/split_operand.cuh"
#include "backend/cuda/rows/norm_row.cuh"
#include "backend/cuda/rows/rows.h"
#include "util/counter_random.h"

namespace beamline::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kElementThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kNormMaxThreads)
    embedding_kernel(const T* __restrict__ table, const int32_t* __restrict__ tokens, int64_t vocab, int64_t hidden,
                     float* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const int32_t id = tokens[row];
  float* destination = out + row * hidden;
  const bool valid = id >= 0 && id < vocab;
  const T* source = table + (valid ? int64_t{id} : 0) * hidden;
  for (int64_t base = threadIdx.x; base < hidden; base += int64_t{kNormPerThread} * blockDim.x) {
    float values[kNormPerThread];
#pragma unroll
    for (int k = 0; k < kNormPerThread; ++k) {
      const int64_t i = base + int64_t{k} * blockDim.x;
      values[k] = valid && i < hidden ? to_float(source[i]) : __int_as_float(0x7fc00000);
    }
#pragma unroll
    for (int k = 0; k < kNormPerThread; ++k) {
      const int64_t i = base + int64_t{k} * blockDim.x;
      if (i < hidden) destination[i] = values[k];
    }
  }
}

template <typename W>
__global__ void __launch_bounds__(kNormMaxThreads)
    rms_norm_registers_kernel(const float* __restrict__ x, const W* __restrict__ weight, float eps, int64_t hidden,
                              float* __restrict__ out) {
  float values[kNormPerThread], scales[kNormPerThread];
  load_owned(x + blockIdx.x * hidden, hidden, values);
  load_owned(weight, hidden, scales);
  const float inverse = inverse_rms_owned(values, hidden, eps);
  float* destination = out + blockIdx.x * hidden;
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x + k * blockDim.x);  // rows here are <= kNormMaxRegisterRow
    if (i < hidden) destination[i] = values[k] * inverse * scales[k];
  }
}

template <typename W>
__global__ void __launch_bounds__(kNormMaxThreads)
    add_rms_norm_registers_kernel(float* __restrict__ residual, const float* __restrict__ y,
                                  const W* __restrict__ weight, float eps, float scale, int64_t hidden) {
  float values[kNormPerThread], scales[kNormPerThread], sums[kNormPerThread];
  float* destination = residual + blockIdx.x * hidden;
  load_owned(y + blockIdx.x * hidden, hidden, values);
  load_owned(weight, hidden, scales);
  load_owned(destination, hidden, sums);
  const float inverse = inverse_rms_owned(values, hidden, eps);
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x + k * blockDim.x);  // rows here are <= kNormMaxRegisterRow
    if (i < hidden) destination[i] = sums[k] + scale * (values[k] * inverse * scales[k]);
  }
}

// The residual row never leaves registers between the add and the next norm.
template <typename W>
__global__ void __launch_bounds__(kNormMaxThreads)
    add_rms_norm_then_norm_registers_kernel(float* __restrict__ residual, const float* __restrict__ y,
                                            const W* __restrict__ weight, const W* __restrict__ next_weight, float eps,
                                            float scale, int64_t hidden, float* __restrict__ out) {
  float values[kNormPerThread], scales[kNormPerThread], sums[kNormPerThread], next_scales[kNormPerThread];
  float* row = residual + blockIdx.x * hidden;
  load_owned(y + blockIdx.x * hidden, hidden, values);
  load_owned(weight, hidden, scales);
  load_owned(row, hidden, sums);
  load_owned(next_weight, hidden, next_scales);
  add_scaled_norm(sums, values, inverse_rms_owned(values, hidden, eps), scales, scale);
  const float next_inverse = inverse_rms_owned(sums, hidden, eps);
  float* destination = out + blockIdx.x * hidden;
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x + k * blockDim.x);  // rows here are <= kNormMaxRegisterRow
    if (i < hidden) {
      row[i] = sums[k];
      destination[i] = sums[k] * next_inverse * next_scales[k];
    }
  }
}

template <typename W, typename O>
__global__ void __launch_bounds__(kNormMaxThreads)
    gather_rms_norm_registers_kernel(const float* __restrict__ x, int64_t x_rows, const int32_t* __restrict__ rows,
                                     const W* __restrict__ weight, float eps, int64_t hidden, O* __restrict__ out) {
  const int32_t source = rows[blockIdx.x];
  O* destination = out + blockIdx.x * hidden;
  const bool valid = source >= 0 && source < x_rows;  // uniform over the block, so block_sum below is reached by all
  float values[kNormPerThread] = {}, scales[kNormPerThread];
  if (valid) load_owned(x + int64_t{source} * hidden, hidden, values);
  load_owned(weight, hidden, scales);
  const float inverse = valid ? inverse_rms_owned(values, hidden, eps) : __int_as_float(0x7fc00000);
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x + k * blockDim.x);  // rows here are <= kNormMaxRegisterRow
    if (i < hidden) destination[i] = from_float<O>(values[k] * inverse * scales[k]);
  }
}

// Rows wider than kNormMaxRegisterRow: loops over the row, reading it twice.
// 1 / sqrt(mean(x²) + eps) of one row, accumulated in FP32.
__device__ float inverse_rms(const float* x, int64_t hidden, float eps) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) sum += x[i] * x[i];
  sum = block_sum(sum);
  return 1.0f / sqrtf(sum / static_cast<float>(hidden) + eps);
}

template <typename W>
__global__ void rms_norm_kernel(const float* x, const W* weight, float eps, int64_t hidden, float* out) {
  const float* row = x + blockIdx.x * hidden;
  const float inverse = inverse_rms(row, hidden, eps);
  float* destination = out + blockIdx.x * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) destination[i] = row[i] * inverse * to_float(weight[i]);
}

template <typename W>
__global__ void add_rms_norm_kernel(float* residual, const float* y, const W* weight, float eps, float scale,
                                    int64_t hidden) {
  const float* row = y + blockIdx.x * hidden;
  const float inverse = inverse_rms(row, hidden, eps);
  float* destination = residual + blockIdx.x * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    destination[i] += scale * (row[i] * inverse * to_float(weight[i]));
}

template <typename W, typename O>
__global__ void gather_rms_norm_kernel(const float* x, int64_t x_rows, const int32_t* rows, const W* weight,
                                       float eps, int64_t hidden, O* out) {
  const int32_t source = rows[blockIdx.x];
  O* destination = out + blockIdx.x * hidden;
  if (source < 0 || source >= x_rows) {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) destination[i] = from_float<O>(__int_as_float(0x7fc00000));
    return;
  }
  const float* row = x + int64_t{source} * hidden;
  const float inverse = inverse_rms(row, hidden, eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    destination[i] = from_float<O>(row[i] * inverse * to_float(weight[i]));
}

// One thread per (row, head, pair j) of q's heads then k's (k_heads 0: q alone), one launch for both; the angle in
// double like the CPU reference, since positions reach 1e6.
__global__ void rope_kernel(float* q, int32_t q_heads, float* k, int32_t k_heads, const int32_t* positions,
                            int64_t rows, int32_t head_dim, double log_theta) {
  const int32_t half = head_dim / 2, heads = q_heads + k_heads;
  const int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index >= rows * heads * half) return;
  const int32_t j = static_cast<int32_t>(index % half);
  const int64_t head = index / half;
  const int64_t row = head / heads;
  const int32_t h = static_cast<int32_t>(head % heads);
  const double inverse_frequency = exp(-2.0 * j / static_cast<double>(head_dim) * log_theta);
  const double angle = static_cast<double>(positions[row]) * inverse_frequency;
  const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
  float* base = h < q_heads ? q + (row * q_heads + h) * head_dim : k + (row * k_heads + (h - q_heads)) * head_dim;
  const float a = base[j], b = base[j + half];
  base[j] = a * c - b * s;
  base[j + half] = b * c + a * s;
}

__global__ void __launch_bounds__(kNormMaxThreads)
    ssmax_kernel(float* __restrict__ q, const int32_t* __restrict__ positions, int64_t width, double base,
                 double exponent) {
  const float factor = static_cast<float>(pow(1.0 + static_cast<double>(positions[blockIdx.x]) / base, exponent));
  float* row = q + blockIdx.x * width;
  for (int64_t start = threadIdx.x; start < width; start += int64_t{kNormPerThread} * blockDim.x) {
    float values[kNormPerThread];
#pragma unroll
    for (int k = 0; k < kNormPerThread; ++k) {
      const int64_t i = start + int64_t{k} * blockDim.x;
      values[k] = i < width ? row[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kNormPerThread; ++k) {
      const int64_t i = start + int64_t{k} * blockDim.x;
      if (i < width) row[i] = values[k] * factor;
    }
  }
}

template <typename O, int kTerms>
__global__ void split_kernel(const float* in, int64_t n, O* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  O terms[kTerms];
  split_terms(in[i], terms);
#pragma unroll
  for (int t = 0; t < kTerms; ++t) out[t * n + i] = terms[t];
}

__global__ void silu_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) gate[i] = silu(gate[i]) * up[i];
}

__global__ void add_terms_kernel(const float* partials, int64_t n, float* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = partials[(kSplitTerms - 1) * n + i];
#pragma unroll
  for (int t = kSplitTerms - 2; t >= 0; --t) sum += partials[t * n + i];
  out[i] = sum;
}

__global__ void soft_cap_kernel(float* x, int64_t n, float cap) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

template <typename O>
__global__ void fill_random_kernel(O* out, int64_t n, uint64_t key, float mean, float stddev) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_float<O>(normal_value(key, static_cast<uint64_t>(i), mean, stddev));
}

__global__ void place_tokens_kernel(const int32_t* source, const int32_t* pairs, int64_t num_pairs, int32_t* tokens) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j < num_pairs) tokens[pairs[2 * j]] = source[pairs[2 * j + 1]];
}

}  // namespace

cudaError_t place_tokens(const int32_t* source, const int32_t* pairs, int64_t num_pairs, int32_t* tokens,
                         cudaStream_t stream) {
  if (num_pairs == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned int>((num_pairs + kThreads - 1) / kThreads);
  place_tokens_kernel<<<blocks, kThreads, 0, stream>>>(source, pairs, num_pairs, tokens);
  return cudaGetLastError();
}

cudaError_t embedding(const void* table, DType table_dtype, int64_t vocab, const int32_t* tokens, int64_t rows,
                      int64_t hidden, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const bool known = dispatch_float(table_dtype, [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<<<static_cast<unsigned int>(rows), norm_threads(hidden), 0, stream>>>(
        static_cast<const T*>(table), tokens, vocab, hidden, out);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t rms_norm(const float* x, const void* weight, DType weight_dtype, float eps, int64_t rows, int64_t hidden,
                     float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const bool known = dispatch_float(weight_dtype, [&](auto tag) {
    using W = decltype(tag);
    const auto blocks = static_cast<unsigned int>(rows);
    if (hidden <= kNormMaxRegisterRow)
      rms_norm_registers_kernel<<<blocks, norm_threads(hidden), 0, stream>>>(x, static_cast<const W*>(weight), eps,
                                                                             hidden, out);
    else
      rms_norm_kernel<<<blocks, kRowThreads, 0, stream>>>(x, static_cast<const W*>(weight), eps, hidden, out);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t add_rms_norm(float* residual, const float* y, const void* weight, DType weight_dtype, float eps,
                         float scale, int64_t rows, int64_t hidden, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const bool known = dispatch_float(weight_dtype, [&](auto tag) {
    using W = decltype(tag);
    const auto blocks = static_cast<unsigned int>(rows);
    if (hidden <= kNormMaxRegisterRow)
      add_rms_norm_registers_kernel<<<blocks, norm_threads(hidden), 0, stream>>>(
          residual, y, static_cast<const W*>(weight), eps, scale, hidden);
    else
      add_rms_norm_kernel<<<blocks, kRowThreads, 0, stream>>>(residual, y, static_cast<const W*>(weight), eps, scale,
                                                              hidden);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t add_rms_norm_then_norm(float* residual, const float* y, const void* weight, const void* next_weight,
                                   DType weight_dtype, float eps, float scale, int64_t rows, int64_t hidden,
                                   float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (hidden > kNormMaxRegisterRow) {  // rows that do not fit in registers: the two looping kernels
    if (const cudaError_t status = add_rms_norm(residual, y, weight, weight_dtype, eps, scale, rows, hidden, stream);
        status != cudaSuccess)
      return status;
    return rms_norm(residual, next_weight, weight_dtype, eps, rows, hidden, out, stream);
  }
  const bool known = dispatch_float(weight_dtype, [&](auto tag) {
    using W = decltype(tag);
    add_rms_norm_then_norm_registers_kernel<<<static_cast<unsigned int>(rows), norm_threads(hidden), 0, stream>>>(
        residual, y, static_cast<const W*>(weight), static_cast<const W*>(next_weight), eps, scale, hidden, out);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t gather_rms_norm(const float* x, int64_t x_rows, const int32_t* rows, int64_t selected, const void* weight,
                            DType weight_dtype, float eps, int64_t hidden, void* out, DType out_dtype,
                            cudaStream_t stream) {
  if (selected == 0) return cudaSuccess;
  bool known = false;
  dispatch_float(weight_dtype, [&](auto weight_tag) {
    using W = decltype(weight_tag);
    known = dispatch_float(out_dtype, [&](auto out_tag) {
      using O = decltype(out_tag);
      const auto blocks = static_cast<unsigned int>(selected);
      if (hidden <= kNormMaxRegisterRow)
        gather_rms_norm_registers_kernel<<<blocks, norm_threads(hidden), 0, stream>>>(
            x, x_rows, rows, static_cast<const W*>(weight), eps, hidden, static_cast<O*>(out));
      else
        gather_rms_norm_kernel<<<blocks, kRowThreads, 0, stream>>>(x, x_rows, rows, static_cast<const W*>(weight), eps,
                                                                   hidden, static_cast<O*>(out));
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t rope(float* q, int32_t q_heads, float* k, int32_t k_heads, const int32_t* positions, int64_t rows,
                 int32_t head_dim, float theta, cudaStream_t stream) {
  const int64_t pairs = rows * (q_heads + k_heads) * (head_dim / 2);
  if (pairs == 0) return cudaSuccess;
  rope_kernel<<<blocks_for(pairs, kElementThreads), kElementThreads, 0, stream>>>(
      q, q_heads, k, k_heads, positions, rows, head_dim, std::log(static_cast<double>(theta)));
  return cudaGetLastError();
}

cudaError_t ssmax_scale(float* q, const int32_t* positions, int64_t rows, int64_t width, float base, float exponent,
                        cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ssmax_kernel<<<static_cast<unsigned int>(rows), norm_threads(width), 0, stream>>>(q, positions, width, base, exponent);
  return cudaGetLastError();
}

cudaError_t split_f32(const float* in, int64_t n, void* out, int terms, DType dtype, cudaStream_t stream) {
  if (terms != 1 && terms != kSplitTerms) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool known = dispatch_float(dtype, [&](auto tag) {
    using O = decltype(tag);
    auto* operands = static_cast<O*>(out);
    if (terms == 1)
      split_kernel<O, 1><<<blocks_for(n, kElementThreads), kElementThreads, 0, stream>>>(in, n, operands);
    else
      split_kernel<O, kSplitTerms><<<blocks_for(n, kElementThreads), kElementThreads, 0, stream>>>(in, n, operands);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  silu_mul_kernel<<<blocks_for(n, kElementThreads), kElementThreads, 0, stream>>>(gate, up, n);
  return cudaGetLastError();
}

cudaError_t add_terms(const float* partials, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_terms_kernel<<<blocks_for(n, kElementThreads), kElementThreads, 0, stream>>>(partials, n, out);
  return cudaGetLastError();
}

cudaError_t soft_cap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  soft_cap_kernel<<<blocks_for(n, kElementThreads), kElementThreads, 0, stream>>>(x, n, cap);
  return cudaGetLastError();
}

cudaError_t fill_random(void* out, DType dtype, int64_t n, uint64_t key, float mean, float stddev, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool known = dispatch_float(dtype, [&](auto tag) {
    using O = decltype(tag);
    fill_random_kernel<<<blocks_for(n, kElementThreads), kElementThreads, 0, stream>>>(static_cast<O*>(out), n, key, mean,
                                                                                        stddev);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace beamline::cuda
