// The batch-invariant projection (--batch-invariant, vLLM's VLLM_BATCH_INVARIANT). Every other projection path picks
// its kernel by the number of rows (weight streaming for one or two rows, cuBLAS above, whose tiling and split-K
// cuBLAS chooses by shape), so a row's sums run in a different order alone than in a batch. Here the grid is
// (output pairs per warp, tiles of kTileRows rows) for every row count: lane l of a warp owns the elements
// k = 8 l + 256 i + e of both its weight rows, folds them into one FP32 accumulator per (row, output) with explicit
// fused multiply-adds in (i, e) order, and the warp's butterfly sums the 32 lanes. A row's place in its tile, the
// tile's place in the grid and the number of rows change nothing in that sequence. CUDA cores, F32 activations:
// exact products whatever --dtype, at the price of reading each weight once per tile of rows.
#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/linear/row_invariant.h"

namespace beamline::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpOutputs = 2;  // weight rows per warp
constexpr int kTileRows = 8;     // activation rows per block
constexpr int kChunk = 8;        // elements per lane and step
constexpr int kWarpStep = 32 * kChunk;

// Elements [k, k + 8) of a weight row as F32, zero past `in`. kVector: one or two 16-byte loads (the caller checked
// alignment and in % 8 == 0); otherwise element by element. The values are the same either way.
template <typename W, bool kVector>
__device__ __forceinline__ void load_weight(const W* row, int64_t k, int64_t in, float (&w)[kChunk]) {
  if constexpr (kVector) {
    if constexpr (sizeof(W) == 2) {
      unpack(load_streaming(row + k), w, W{});
    } else {
      const float4 a = *reinterpret_cast<const float4*>(row + k);
      const float4 b = *reinterpret_cast<const float4*>(row + k + 4);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) w[e] = k + e < in ? to_float(row[k + e]) : 0.0f;
  }
}

template <bool kVector>
__device__ __forceinline__ void load_row(const float* x, int64_t k, int64_t in, float (&v)[kChunk]) {
  if constexpr (kVector) {
    const float4 a = *reinterpret_cast<const float4*>(x + k);
    const float4 b = *reinterpret_cast<const float4*>(x + k + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = k + e < in ? x[k + e] : 0.0f;
  }
}

template <typename W, bool kVector>
__global__ void __launch_bounds__(kThreads)
    row_invariant_kernel(const float* __restrict__ x, int64_t rows, const W* __restrict__ weight, int64_t in,
                         int64_t out, float softcap, float* __restrict__ y) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t first_output = (int64_t{blockIdx.x} * kWarps + warp) * kWarpOutputs;
  const int64_t first_row = int64_t{blockIdx.y} * kTileRows;
  if (first_output >= out) return;
  const int tile_rows = rows - first_row < kTileRows ? static_cast<int>(rows - first_row) : kTileRows;
  const W* weight_row[kWarpOutputs];
#pragma unroll
  for (int j = 0; j < kWarpOutputs; ++j) weight_row[j] = weight + (first_output + j < out ? first_output + j : out - 1) * in;

  float sum[kTileRows][kWarpOutputs] = {};
  // Unrolled so that the next chunk's weight loads are in flight during this one's FMAs; the order of the FMAs into
  // each accumulator stays the k order.
#pragma unroll 2
  for (int64_t k = int64_t{lane} * kChunk; k < in; k += kWarpStep) {
    float w[kWarpOutputs][kChunk];
#pragma unroll
    for (int j = 0; j < kWarpOutputs; ++j) load_weight<W, kVector>(weight_row[j], k, in, w[j]);
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) {
      if (r >= tile_rows) break;
      float v[kChunk];
      load_row<kVector>(x + (first_row + r) * in, k, in, v);
#pragma unroll
      for (int j = 0; j < kWarpOutputs; ++j)
#pragma unroll
        for (int e = 0; e < kChunk; ++e) sum[r][j] = __fmaf_rn(w[j][e], v[e], sum[r][j]);
    }
  }
#pragma unroll
  for (int r = 0; r < kTileRows; ++r)
#pragma unroll
    for (int j = 0; j < kWarpOutputs; ++j) sum[r][j] = warp_sum(sum[r][j]);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kTileRows; ++r) {
    if (r >= tile_rows) break;
#pragma unroll
    for (int j = 0; j < kWarpOutputs; ++j) {
      if (first_output + j >= out) break;
      float value = sum[r][j];
      if (softcap > 0.0f) value = softcap * tanhf(value / softcap);
      y[(first_row + r) * out + first_output + j] = value;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t project_row_invariant(const float* x, int64_t rows, const void* weight, DType dtype, int64_t in,
                                  int64_t out, float softcap, float* y, cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  if (in <= 0 || tiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(blocks_for(out, kWarps * kWarpOutputs), static_cast<unsigned int>(tiles));
  const bool vector = in % kChunk == 0 && aligned16(x) && aligned16(weight);
  const bool known = dispatch_float(dtype, [&](auto tag) {
    using W = decltype(tag);
    const auto* w = static_cast<const W*>(weight);
    if (vector)
      row_invariant_kernel<W, true><<<grid, kThreads, 0, stream>>>(x, rows, w, in, out, softcap, y);
    else
      row_invariant_kernel<W, false><<<grid, kThreads, 0, stream>>>(x, rows, w, in, out, softcap, y);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace beamline::cuda
