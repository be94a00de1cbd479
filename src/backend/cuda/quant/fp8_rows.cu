// FP8 block-128 kernels bound by memory: the activation quantizer (F32 rows to E4M3 per token and 128 channels) and
// the weight-streaming projections and one-token experts of decode (W8A16: each FP8 weight read once with 16-byte
// loads, dequantized in registers with its block scale, dotted with the F32 activations in FP32; fp8.h).
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

// ---- one token's experts ----

// activated[j, i] = silu(gate_e[i] · h) * (up_e[i] · h) for e = ids[blockIdx.y]: one warp per intermediate row.
constexpr int kGateUpWarps = 8;
constexpr int kGateUpUnroll = 5;
__global__ void __launch_bounds__(kGateUpWarps * 32)
    one_token_gate_up_kernel(const float* __restrict__ h, const int32_t* __restrict__ ids, Experts experts,
                             float* __restrict__ activated) {
  const int64_t row = int64_t{blockIdx.x} * kGateUpWarps + threadIdx.x / 32;
  const int j = static_cast<int>(blockIdx.y);
  const int32_t e = ids[j];
  if (row >= experts.intermediate) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t hidden = experts.hidden, scale_width = blocks_of(hidden);
  if (e < 0 || e >= experts.experts) {  // the down pass makes the token NaN
    if (lane == 0) activated[j * experts.intermediate + row] = 0.0f;
    return;
  }
  const uint8_t* matrix[2] = {static_cast<const uint8_t*>(experts.weight[0][e]) + row * hidden,
                              static_cast<const uint8_t*>(experts.weight[1][e]) + row * hidden};
  const float* scale[2] = {experts.scale[0][e] + (row / kBlock) * scale_width,
                           experts.scale[1][e] + (row / kBlock) * scale_width};
  float sum[2] = {};
  for (int64_t base = int64_t{lane} * kElementsPerLoad; base < hidden; base += int64_t{kWarpStep} * kGateUpUnroll) {
    uint4 bits[kGateUpUnroll][2];
    float block_scale[kGateUpUnroll][2];
#pragma unroll
    for (int u = 0; u < kGateUpUnroll; ++u) {
      const int64_t k = base + u * kWarpStep;
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        bits[u][m] = k < hidden ? load_streaming(matrix[m] + k) : uint4{};
        block_scale[u][m] = k < hidden ? __ldg(scale[m] + k / kBlock) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kGateUpUnroll; ++u) {
      const int64_t k = base + u * kWarpStep;
      if (k >= hidden) break;
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        float w[kElementsPerLoad];
        unpack_e4m3(bits[u][m], w);
        sum[m] += block_scale[u][m] * dot16(w, h + k);
      }
    }
  }
  const float gate = warp_sum(sum[0]), up = warp_sum(sum[1]);
  if (lane == 0) activated[j * experts.intermediate + row] = silu(gate) * up;
}

// out[n] = sum over j in order of weights[j] * (down_{ids[j]}[n] · activated[j]): each warp streams row n of every
// routed expert's down matrix, one 16-byte load of each in flight per lane and step.
constexpr int kDownWarps = 2;
__global__ void __launch_bounds__(kDownWarps * 32)
    one_token_down_kernel(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                          const float* __restrict__ weights, int32_t top_k, Experts experts, float* __restrict__ out) {
  const int64_t row = int64_t{blockIdx.x} * kDownWarps + threadIdx.x / 32;
  if (row >= experts.hidden) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t inter = experts.intermediate, scale_width = blocks_of(inter);
  const uint8_t* down[kMaxStreamTopK];
  const float* scale[kMaxStreamTopK];
  bool valid = true;
#pragma unroll
  for (int j = 0; j < kMaxStreamTopK; ++j) {
    const int32_t e = j < top_k ? ids[j] : 0;
    const bool known = e >= 0 && e < experts.experts;
    valid = valid && known;
    // An unknown expert reads expert 0's row, so every load stays in bounds; the output is NaN then anyway.
    down[j] = static_cast<const uint8_t*>(experts.weight[2][known ? e : 0]) + row * inter;
    scale[j] = experts.scale[2][known ? e : 0] + (row / kBlock) * scale_width;
  }
  float sum[kMaxStreamTopK] = {};
#pragma unroll 1
  for (int64_t k = int64_t{lane} * kElementsPerLoad; k < inter; k += kWarpStep) {
    uint4 bits[kMaxStreamTopK];
    float block_scale[kMaxStreamTopK];
#pragma unroll
    for (int j = 0; j < kMaxStreamTopK; ++j) {
      if (j < top_k) {
        bits[j] = load_streaming(down[j] + k);
        block_scale[j] = __ldg(scale[j] + k / kBlock);
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxStreamTopK; ++j) {
      if (j < top_k) {
        float w[kElementsPerLoad];
        unpack_e4m3(bits[j], w);
        sum[j] += block_scale[j] * dot16(w, activated + j * inter + k);
      }
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxStreamTopK; ++j) {
    const float dot = warp_sum(sum[j]);
    if (j < top_k) total += weights[j] * dot;
  }
  if (lane == 0) out[row] = valid ? total : __int_as_float(0x7fc00000);
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

cudaError_t moe_one_token(const float* h, const int32_t* ids, const float* weights, int32_t top_k,
                          const Experts& experts, float* activated, float* out, cudaStream_t stream) {
  if (top_k < 1 || top_k > kMaxStreamTopK || !moe_supported(experts.experts, experts.hidden, experts.intermediate))
    return cudaErrorInvalidValue;
  const dim3 up_grid(blocks_for(experts.intermediate, kGateUpWarps), static_cast<unsigned int>(top_k));
  one_token_gate_up_kernel<<<up_grid, kGateUpWarps * 32, 0, stream>>>(h, ids, experts, activated);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  one_token_down_kernel<<<blocks_for(experts.hidden, kDownWarps), kDownWarps * 32, 0, stream>>>(activated, ids, weights,
                                                                                                top_k, experts, out);
  return cudaGetLastError();
}

}  // namespace beamline::cuda::fp8
