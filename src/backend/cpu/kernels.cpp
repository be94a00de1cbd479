#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define BEAMLINE_CPU_AVX2 1
#endif

#include "backend/cpu/dequantize.h"
#include "backend/cpu/projection.h"
#include "quant/element_codes.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline::cpu {

void to_f32(const std::byte* data, DType dtype, int64_t offset, int64_t n, float* out) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, data + offset * 4, static_cast<std::size_t>(n) * 4);
      return;
    case DType::BF16: {
      const auto* in = reinterpret_cast<const uint16_t*>(data) + offset;
      int64_t i = 0;
#ifdef BEAMLINE_CPU_AVX2
      for (; i + 8 <= n; i += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
      }
#endif
      for (; i < n; ++i) out[i] = bf16_to_f32(in[i]);
      return;
    }
    case DType::F16: {
      const auto* in = reinterpret_cast<const uint16_t*>(data) + offset;
      int64_t i = 0;
#ifdef BEAMLINE_CPU_AVX2
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
      for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
      return;
    }
    case DType::F8_E4M3: {  // an FP8 KV cache: the codes (attention.cpp multiplies by the per-tensor scales)
      const auto* in = reinterpret_cast<const uint8_t*>(data) + offset;
      const std::array<float, 256>& table = e4m3_table();
      for (int64_t i = 0; i < n; ++i) out[i] = table[in[i]];
      return;
    }
    default:
      fail("cpu backend: cannot read {} values as floats", dtype_name(dtype));
  }
}

void from_f32(const float* values, int64_t n, DType dtype, int64_t offset, std::byte* data) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(data + offset * 4, values, static_cast<std::size_t>(n) * 4);
      return;
    case DType::BF16: {
      auto* out = reinterpret_cast<uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(values[i]);
      return;
    }
    case DType::F8_E4M3: {  // round to nearest even, saturating at ±448 (quant/element_codes.h)
      auto* out = reinterpret_cast<uint8_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_e4m3(values[i]);
      return;
    }
    default:
      fail("cpu backend: cannot store floats as {}", dtype_name(dtype));
  }
}

#ifdef BEAMLINE_CPU_AVX2
namespace {
inline float horizontal_sum(__m256 v) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}
}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  if (i + 8 <= n) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    i += 8;
  }
  float sum = horizontal_sum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

namespace {
// Four dot products against one x row; each equals dot(w_r, x) exactly (same operations in the same order).
void dot4(const float* w0, const float* w1, const float* w2, const float* w3, const float* x, int64_t n,
          float* out) {
  __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 xl = _mm256_loadu_ps(x + i), xh = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xl, a0);
    b0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i + 8), xh, b0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xl, a1);
    b1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i + 8), xh, b1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xl, a2);
    b2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i + 8), xh, b2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xl, a3);
    b3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i + 8), xh, b3);
  }
  if (i + 8 <= n) {
    const __m256 xl = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xl, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xl, a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xl, a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xl, a3);
    i += 8;
  }
  float s0 = horizontal_sum(_mm256_add_ps(a0, b0)), s1 = horizontal_sum(_mm256_add_ps(a1, b1));
  float s2 = horizontal_sum(_mm256_add_ps(a2, b2)), s3 = horizontal_sum(_mm256_add_ps(a3, b3));
  for (; i < n; ++i) {
    s0 += w0[i] * x[i];
    s1 += w1[i] * x[i];
    s2 += w2[i] * x[i];
    s3 += w3[i] * x[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}
}  // namespace
#else
float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int lane = 0; lane < 8; ++lane) lanes[lane] += a[i + lane] * b[i + lane];
  float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

namespace {
void dot4(const float* w0, const float* w1, const float* w2, const float* w3, const float* x, int64_t n,
          float* out) {
  out[0] = dot(w0, x, n);
  out[1] = dot(w1, x, n);
  out[2] = dot(w2, x, n);
  out[3] = dot(w3, x, n);
}
}  // namespace
#endif

void lora_rows(const float* x, int64_t rows, const LoraTensors& lora, const int32_t* adapters, float* y,
               int64_t y_stride) {
  const int64_t adapter_count = lora.a.dim(0), rank = lora.a.dim(1), in = lora.a.dim(2), out = lora.b.dim(1);
  for (int64_t t = 0; t < rows; ++t)
    require(adapters[t] >= -1 && adapters[t] < adapter_count, "lora: adapter {} of row {} outside the {} adapters",
            adapters[t], t, adapter_count);
  ThreadPool::global().parallel_for(static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    std::vector<float> shrunk(static_cast<std::size_t>(rank));
    for (auto t = static_cast<int64_t>(begin); t < static_cast<int64_t>(end); ++t) {
      if (adapters[t] < 0) continue;
      const float* a = lora.a.data<const float>() + adapters[t] * rank * in;
      const float* b = lora.b.data<const float>() + adapters[t] * out * rank;
      for (int64_t r = 0; r < rank; ++r) shrunk[static_cast<std::size_t>(r)] = dot(a + r * in, x + t * in, in);
      for (int64_t o = 0; o < out; ++o) y[t * y_stride + o] += dot(b + o * rank, shrunk.data(), rank);
    }
  });
}

void lora_table_rows(const float* x, int64_t rows, const LoraTable& table, const int32_t* entries, float* y,
                     int64_t y_stride) {
  const int64_t count = table.entries.dim(0), in = table.in, out = table.out;
  const int64_t* fields = table.entries.data<const int64_t>();
  for (int64_t t = 0; t < rows; ++t) {
    require(entries[t] >= -1 && entries[t] < count, "lora: entry {} of row {} outside the table's {}", entries[t], t,
            count);
    if (entries[t] < 0) continue;
    const int64_t rank = fields[entries[t] * 3 + 2];
    require(rank >= 0 && rank <= table.max_rank, "lora: entry {} of row {} has rank {} outside [0, {}]", entries[t], t,
            rank, table.max_rank);
  }
  ThreadPool::global().parallel_for(static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    std::vector<float> shrunk(static_cast<std::size_t>(table.max_rank));
    for (auto t = static_cast<int64_t>(begin); t < static_cast<int64_t>(end); ++t) {
      if (entries[t] < 0) continue;
      const int64_t* entry = fields + entries[t] * 3;
      const int64_t rank = entry[2];
      if (rank == 0) continue;
      const auto* a = reinterpret_cast<const float*>(entry[0]);
      const auto* b = reinterpret_cast<const float*>(entry[1]);
      for (int64_t r = 0; r < rank; ++r) shrunk[static_cast<std::size_t>(r)] = dot(a + r * in, x + t * in, in);
      for (int64_t o = 0; o < out; ++o) y[t * y_stride + o] += dot(b + o * rank, shrunk.data(), rank);
    }
  });
}

void matmul_wt(const float* x, int64_t rows, const LinearTensors& weight, float* y, int64_t y_stride) {
  const Tensor& w = weight.weight;
  const Projection shape = projection(weight, "matmul", "weight");
  const int64_t out = shape.out, in = shape.in;
  constexpr int64_t kRowsPerGroup = 4;
  const int64_t groups = (out + kRowsPerGroup - 1) / kRowsPerGroup;
  const bool direct = w.dtype() == DType::F32;
  // Enough work per chunk to pay for the hand-off between threads.
  const auto min_chunk = static_cast<std::size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, in * rows)));
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(groups),
      [&](std::size_t group_begin, std::size_t group_end) {
        thread_local std::vector<float> converted;
        if (!direct) converted.resize(static_cast<std::size_t>(kRowsPerGroup * in));
        for (auto group = static_cast<int64_t>(group_begin); group < static_cast<int64_t>(group_end); ++group) {
          const int64_t first = group * kRowsPerGroup, count = std::min(kRowsPerGroup, out - first);
          const float* row[kRowsPerGroup];
          // Quantized weights: the group's rows dequantized exactly (cpu/dequantize.h), then the same FP32 dots.
          if (shape.quantized) dequantize_weight_rows(*shape.quantized, first, count, converted.data());
          for (int64_t r = 0; r < count; ++r) {
            if (shape.quantized) {
              row[r] = converted.data() + r * in;
            } else if (direct) {
              row[r] = w.data<const float>() + (first + r) * in;
            } else {
              to_f32(w.raw(), w.dtype(), (first + r) * in, in, converted.data() + r * in);
              row[r] = converted.data() + r * in;
            }
          }
          for (int64_t t = 0; t < rows; ++t) {
            const float* xt = x + t * in;
            float* yt = y + t * y_stride + first;
            if (count == kRowsPerGroup) {
              dot4(row[0], row[1], row[2], row[3], xt, in, yt);
            } else {
              for (int64_t r = 0; r < count; ++r) yt[r] = dot(row[r], xt, in);
            }
          }
        }
      },
      min_chunk);
}

void rms_row(const float* x, const Tensor& weight, float eps, int64_t n, float* out) {
  const float mean_square = dot(x, x, n) / static_cast<float>(n);
  const float inverse = 1.0f / std::sqrt(mean_square + eps);
  if (weight.dtype() == DType::F32) {
    const float* w = weight.data<const float>();
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inverse * w[i];
    return;
  }
  thread_local std::vector<float> converted;
  converted.resize(static_cast<std::size_t>(n));
  to_f32(weight.raw(), weight.dtype(), 0, n, converted.data());
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inverse * converted[i];
}

}  // namespace beamline::cpu
