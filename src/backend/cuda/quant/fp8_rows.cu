// FP8 block-128 kernels bound by memory: the activation quantizer (F32 rows to E4M3 per token and 128 channels) and
// the weight-streaming projections of decode (W8A16: each FP8 weight read once with 16-byte loads, dequantized in
// registers with its block scale, dotted with the F32 activations in FP32; fp8.h). The one-token experts are in
// fp8_token_moe.cu.
#include <cuda_fp8.h>

#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/quant/e4m3_unpack.cuh"
#include "backend/cuda/quant/fp8.h"
#include "util/counter_random.h"

namespace beamline::cuda::fp8 {
namespace {

// ---- activation quantizer: one warp per (row, 128-channel block), four channels per lane ----
constexpr int kQuantizeWarps = 8;

__global__ void __launch_bounds__(kQuantizeWarps * 32)
    quantize_kernel(const float* __restrict__ x, int64_t rows, int64_t cols, int64_t blocks, uint8_t* __restrict__ q,
                    float* __restrict__ scales, int64_t scale_row_stride, int64_t scale_block_stride) {
  const int64_t task = int64_t{blockIdx.x} * kQuantizeWarps + threadIdx.x / 32;
  if (task >= rows * blocks) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = task / blocks, block = task % blocks, column = block * kBlock + lane * 4;
  const bool inside = column < cols;  // cols is a multiple of 16, so a lane's four channels are all in or all out
  const float4 v = inside ? *reinterpret_cast<const float4*>(x + row * cols + column) : make_float4(0, 0, 0, 0);
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float scale = fmaxf(amax, kMinScaledAmax) / kE4m3Max;
  if (lane == 0) scales[row * scale_row_stride + block * scale_block_stride] = scale;
  if (!inside) return;
  const __nv_fp8x2_storage_t low = __nv_cvt_float2_to_fp8x2(make_float2(v.x / scale, v.y / scale), __NV_SATFINITE,
                                                            __NV_E4M3);
  const __nv_fp8x2_storage_t high = __nv_cvt_float2_to_fp8x2(make_float2(v.z / scale, v.w / scale), __NV_SATFINITE,
                                                             __NV_E4M3);
  *reinterpret_cast<uint32_t*>(q + row * cols + column) = uint32_t{low} | uint32_t{high} << 16;
}

// ---- dequantization in registers ----
// w · x[0, 16) for 16-byte aligned F32 activations.
__device__ __forceinline__ float dot16(const float (&w)[16], const float* x) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; i += 4) {
    const float4 a = *reinterpret_cast<const float4*>(x + i);
    sum += w[i] * a.x + w[i + 1] * a.y + w[i + 2] * a.z + w[i + 3] * a.w;
  }
  return sum;
}

constexpr int kElementsPerLoad = 16;  // E4M3 weights per 16-byte load
constexpr int kWarpStep = 32 * kElementsPerLoad;

// ---- projections of few rows ----
constexpr int kStreamWarps = 8;
constexpr int kWarpRows = 2;  // weight rows per warp

struct Stacked {
  const uint8_t* weight[kMaxStreamWeights];
  const float* scale[kMaxStreamWeights];
  float* y[kMaxStreamWeights];
  int64_t first_row[kMaxStreamWeights + 1];
  int32_t count;
  int64_t in, total_rows;
  float softcap;
};

// Each warp streams two stacked weight rows; lane l takes the 16-element chunks l, l + 32, ... of both, so every
// chunk lies in one 128-wide scale block. kUnroll chunks per row are loaded before the first is used.
template <int kRows, int kUnroll>
__global__ void __launch_bounds__(kStreamWarps * 32)
    stream_kernel(const float* __restrict__ x, int32_t rows, Stacked stacked) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first = (int64_t{blockIdx.x} * kStreamWarps + warp) * kWarpRows;
  if (first >= stacked.total_rows) return;
  const int64_t in = stacked.in, scale_width = blocks_of(in);
  const uint8_t* weight_row[kWarpRows];
  const float* scale_row[kWarpRows];
  float* y_column[kWarpRows];
  int64_t y_width[kWarpRows];
#pragma unroll
  for (int j = 0; j < kWarpRows; ++j) {
    // Rows past the last are clamped onto it (read twice, never stored); the weight is picked by unrolled
    // comparisons so that the parameter is not copied to local memory.
    const int64_t row = min(first + j, stacked.total_rows - 1);
    const uint8_t* weight = stacked.weight[0];
    const float* scale = stacked.scale[0];
    float* y = stacked.y[0];
    int64_t start = 0, end = stacked.first_row[1];
#pragma unroll
    for (int s = 1; s < kMaxStreamWeights; ++s) {
      if (s < stacked.count && row >= stacked.first_row[s]) {
        weight = stacked.weight[s];
        scale = stacked.scale[s];
        y = stacked.y[s];
        start = stacked.first_row[s];
        end = stacked.first_row[s + 1];
      }
    }
    weight_row[j] = weight + (row - start) * in;
    scale_row[j] = scale + ((row - start) / kBlock) * scale_width;
    y_column[j] = y + (row - start);
    y_width[j] = end - start;
  }
  float sum[kRows][kWarpRows] = {};
  for (int64_t base = int64_t{lane} * kElementsPerLoad; base < in; base += int64_t{kWarpStep} * kUnroll) {
    uint4 bits[kUnroll][kWarpRows];
    float block_scale[kUnroll][kWarpRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = base + u * kWarpStep;
#pragma unroll
      for (int j = 0; j < kWarpRows; ++j) {
        bits[u][j] = k < in ? load_streaming(weight_row[j] + k) : uint4{};
        block_scale[u][j] = k < in ? __ldg(scale_row[j] + k / kBlock) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = base + u * kWarpStep;
      if (k >= in) break;
#pragma unroll
      for (int j = 0; j < kWarpRows; ++j) {
        float w[kElementsPerLoad];
        unpack_e4m3(bits[u][j], w);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (r < rows) sum[r][j] += block_scale[u][j] * dot16(w, x + r * in + k);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kWarpRows; ++j) {
      float value = warp_sum(sum[r][j]);
      if (lane != 0 || r >= rows || first + j >= stacked.total_rows) continue;
      if (stacked.softcap > 0.0f) value = stacked.softcap * tanhf(value / stacked.softcap);
      y_column[j][r * y_width[j]] = value;
    }
}

__global__ void fill_random_kernel(uint8_t* out, int64_t n, uint64_t key, float mean, float stddev) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = __nv_cvt_float_to_fp8(normal_value(key, static_cast<uint64_t>(i), mean, stddev), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace

cudaError_t fill_random_e4m3(uint8_t* out, int64_t n, uint64_t key, float mean, float stddev, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_random_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, n, key, mean, stddev);
  return cudaGetLastError();
}

bool quantize_supported(int64_t cols) { return cols > 0 && cols % 16 == 0; }

namespace {

cudaError_t launch_quantize(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                            int64_t scale_row_stride, int64_t scale_block_stride, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!quantize_supported(cols) || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 4 != 0)
    return cudaErrorInvalidValue;
  const int64_t blocks = blocks_of(cols);
  quantize_kernel<<<blocks_for(rows * blocks, kQuantizeWarps), kQuantizeWarps * 32, 0, stream>>>(
      x, rows, cols, blocks, q, scales, scale_row_stride, scale_block_stride);
  return cudaGetLastError();
}

}  // namespace

cudaError_t quantize_rows(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales, cudaStream_t stream) {
  return launch_quantize(x, rows, cols, q, scales, blocks_of(cols), 1, stream);
}

cudaError_t quantize_rows_token_major(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                                      cudaStream_t stream) {
  return launch_quantize(x, rows, cols, q, scales, 1, rows, stream);
}

bool stream_supported(int64_t rows, int64_t in) {
  return rows >= 1 && rows <= kMaxStreamRows && in > 0 && in % kElementsPerLoad == 0;
}

cudaError_t stream_rows(const float* x, int64_t rows, const StreamBatch& batch, cudaStream_t stream) {
  if (batch.count < 1 || batch.count > kMaxStreamWeights || !stream_supported(rows, batch.in) ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return cudaErrorInvalidValue;
  Stacked stacked{};
  stacked.count = batch.count;
  stacked.in = batch.in;
  stacked.softcap = batch.softcap;
  for (int32_t s = 0; s < batch.count; ++s) {
    if (reinterpret_cast<uintptr_t>(batch.weight[s]) % 16 != 0) return cudaErrorInvalidValue;
    stacked.weight[s] = batch.weight[s];
    stacked.scale[s] = batch.scale[s];
    stacked.y[s] = batch.y[s];
    stacked.first_row[s + 1] = stacked.first_row[s] + batch.out[s];
  }
  stacked.total_rows = stacked.first_row[batch.count];
  if (stacked.total_rows == 0) return cudaSuccess;
  const auto blocks = blocks_for((stacked.total_rows + kWarpRows - 1) / kWarpRows, kStreamWarps);
  if (rows == 1)
    stream_kernel<1, 4><<<blocks, kStreamWarps * 32, 0, stream>>>(x, 1, stacked);
  else
    stream_kernel<2, 4><<<blocks, kStreamWarps * 32, 0, stream>>>(x, static_cast<int32_t>(rows), stacked);
  return cudaGetLastError();
}

}  // namespace beamline::cuda::fp8
