// Projections y = x Wᵀ for one or two activation rows (decode): the work is reading W once, with two FLOPs per
// weight per row, so it is a bandwidth problem, not a GEMM. Each warp streams two weight rows with 16-byte loads,
// several of them in flight before the first use, and dots them with the F32 activation rows (read through L1, each
// chunk serving both weight rows); no rounding of the activations and no tensor cores, so the result is FP32-exact
// up to summation order, in one launch. Several weights of the same width (q, k and v) are one grid over their
// stacked rows. When the rows are too few to fill the GPU (k or v alone), the warps of a block split each row's
// chunks between them and sum their parts in a fixed order (deterministic, no atomics).
// More activation rows do not pay on the CUDA cores for large weights: every row re-reads its activations from L1 for
// each weight chunk, and at 4 rows that traffic, not HBM, sets the pace (bench/results/2026-12-01-linear.md), where
// cuBLAS's tensor-core GEMMs read the weights at the same speed for 1 row as for 32. Small weights (a drafter's, a
// small model's) are bound by latency instead, and one launch beats cuBLAS's two (activation rounding, GEMM) up to 8
// rows: the backend streams those (CudaBackend::kSmallStreamingMaxRows).
#include <algorithm>
#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/linear/projection.h"

namespace beamline::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 2;           // weight rows per warp
constexpr int kElementsPerLoad = 8;    // 16 bytes of BF16/F16
constexpr int kElementsPerWarpStep = 32 * kElementsPerLoad;

// The kernel's view of a ProjectionBatch: where each stacked weight's rows start.
struct StackedWeights {
  const void* weight[kMaxProjectionWeights];
  float* y[kMaxProjectionWeights];
  int64_t first_row[kMaxProjectionWeights + 1];  // first stacked row of each weight; [count] = all rows
  int64_t total_rows;
  int32_t count;
  int64_t in;
  float softcap;
};

// kRows: activation rows the warp keeps sums for (rows <= kRows); kUnroll: chunks of each weight row loaded
// before the first is used (kUnroll * kWarpRows 16-byte loads in flight per lane). `k_split` warps of a block
// (1, 2, 4 or 8) share each pair of weight rows, warp w taking the chunks congruent to w mod k_split.
template <typename W, int kRows, int kUnroll, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    project_kernel(const float* __restrict__ x, int32_t rows, StackedWeights stacked, int32_t k_split) {
  __shared__ float partial[kWarps][kRows * kWarpRows];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int part = warp % k_split;
  const int64_t first = (int64_t{blockIdx.x} * (kWarps / k_split) + warp / k_split) * kWarpRows;
  const int64_t total = stacked.total_rows, in = stacked.in;

  // Each row's weight, output and width, picked by unrolled comparisons (an indexed read of the parameter
  // would copy it to local memory). Rows past the last are clamped onto it (a few bytes read twice at the
  // grid's end) and not written.
  const W* weight_row[kWarpRows];
  float* y_column[kWarpRows];
  int64_t y_width[kWarpRows];
#pragma unroll
  for (int j = 0; j < kWarpRows; ++j) {
    const int64_t row = min(first + j, total - 1);
    const void* weight = stacked.weight[0];
    float* y = stacked.y[0];
    int64_t start = 0, end = stacked.first_row[1];
#pragma unroll
    for (int s = 1; s < kMaxProjectionWeights; ++s) {
      if (s < stacked.count && row >= stacked.first_row[s]) {
        weight = stacked.weight[s];
        y = stacked.y[s];
        start = stacked.first_row[s];
        end = stacked.first_row[s + 1];
      }
    }
    weight_row[j] = static_cast<const W*>(weight) + (row - start) * in;
    y_column[j] = y + (row - start);
    y_width[j] = end - start;
  }

  float sum[kRows][kWarpRows] = {};
  const int64_t stride = int64_t{kElementsPerWarpStep} * k_split;
  for (int64_t base = (int64_t{part} * 32 + lane) * kElementsPerLoad; base < in; base += stride * kUnroll) {
    uint4 bits[kUnroll][kWarpRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = base + u * stride;
#pragma unroll
      for (int j = 0; j < kWarpRows; ++j) bits[u][j] = k < in ? load_streaming(weight_row[j] + k) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = base + u * stride;
      if (k >= in) break;
      float w[kWarpRows][kElementsPerLoad];
#pragma unroll
      for (int j = 0; j < kWarpRows; ++j) unpack(bits[u][j], w[j], W{});
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int j = 0; j < kWarpRows; ++j) sum[r][j] += dot8(w[j], x + r * in + k);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kWarpRows; ++j) sum[r][j] = warp_sum(sum[r][j]);

  auto store = [&](int r, int j, float value) {
    if (first + j >= total || r >= rows) return;
    if (stacked.softcap > 0.0f) value = stacked.softcap * tanhf(value / stacked.softcap);
    y_column[j][r * y_width[j]] = value;
  };
  if (k_split == 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < kWarpRows; ++j) store(r, j, sum[r][j]);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int j = 0; j < kWarpRows; ++j) partial[warp][r * kWarpRows + j] = sum[r][j];
  __syncthreads();
  if (part == 0 && lane < kRows * kWarpRows) {
    float parts = 0.0f;
    for (int p = 0; p < k_split; ++p) parts += partial[warp + p][lane];
    // Unrolled so that the lane's (r, j) picks registers, not a local copy of the arrays.
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int j = 0; j < kWarpRows; ++j)
        if (lane == r * kWarpRows + j) store(r, j, parts);
  }
}

int multiprocessors() {
  static const int count = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms > 0 ? sms : 1;
  }();
  return count;
}

// Blocks of one instantiation that fit on the GPU at once (its registers decide), asked once.
template <typename W, int kRows, int kUnroll, int kMinBlocks>
int64_t resident_blocks() {
  static const int64_t blocks = [] {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, project_kernel<W, kRows, kUnroll, kMinBlocks>, kThreads, 0);
    return int64_t{std::max(per_sm, 1)} * multiprocessors();
  }();
  return blocks;
}

// How many warps of a block share each pair of weight rows. One wave of blocks that all fit on the GPU at once
// does equal work everywhere and ends together, so when the rows allow it the split is the largest that still
// fits in one wave (k or v alone need 8 to fill the GPU; q|k|v and o need none). Otherwise the split whose last
// wave is fullest (a partial last wave leaves slots idle while the bandwidth-bound blocks before it finish). Each
// warp keeps at least two chunks per lane of its rows.
int32_t choose_k_split(int64_t warp_tasks, int64_t in, int64_t slots) {
  auto blocks = [&](int32_t k_split) { return (warp_tasks * k_split + kWarps - 1) / kWarps; };
  auto allowed = [&](int32_t k_split) { return in >= int64_t{2} * kElementsPerWarpStep * k_split; };
  if (blocks(1) <= slots) {
    int32_t k_split = 1;
    while (k_split < kWarps && allowed(2 * k_split) && blocks(2 * k_split) <= slots) k_split *= 2;
    return k_split;
  }
  int32_t best = 1;
  double best_fill = 0.0;
  for (int32_t k_split = 1; k_split <= kWarps && (k_split == 1 || allowed(k_split)); k_split *= 2) {
    const double waves = static_cast<double>(blocks(k_split)) / static_cast<double>(slots);
    const double fill = waves / std::ceil(waves);
    if (fill > best_fill + 0.02) {
      best = k_split;
      best_fill = fill;
    }
  }
  return best;
}

template <typename W, int kRows, int kUnroll, int kMinBlocks>
cudaError_t launch(const float* x, int32_t rows, const StackedWeights& stacked, cudaStream_t stream) {
  const int64_t warp_tasks = (stacked.total_rows + kWarpRows - 1) / kWarpRows;
  const int32_t k_split = choose_k_split(warp_tasks, stacked.in, resident_blocks<W, kRows, kUnroll, kMinBlocks>());
  const auto blocks = static_cast<unsigned int>((warp_tasks * k_split + kWarps - 1) / kWarps);
  project_kernel<W, kRows, kUnroll, kMinBlocks><<<blocks, kThreads, 0, stream>>>(x, rows, stacked, k_split);
  return cudaGetLastError();
}

}  // namespace

bool projection_supported(DType dtype, int64_t rows, int64_t in) {
  return (dtype == DType::BF16 || dtype == DType::F16) && rows >= 1 && rows <= kMaxProjectionRows &&
         in % kElementsPerLoad == 0;
}

cudaError_t project_rows(const float* x, int64_t rows, const ProjectionBatch& batch, cudaStream_t stream) {
  if (batch.count < 1 || batch.count > kMaxProjectionWeights || !projection_supported(batch.dtype, rows, batch.in) ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return cudaErrorInvalidValue;
  StackedWeights stacked{};
  stacked.count = batch.count;
  stacked.in = batch.in;
  stacked.softcap = batch.softcap;
  for (int32_t s = 0; s < batch.count; ++s) {
    if (reinterpret_cast<uintptr_t>(batch.weight[s]) % 16 != 0) return cudaErrorInvalidValue;
    stacked.weight[s] = batch.weight[s];
    stacked.y[s] = batch.y[s];
    stacked.first_row[s + 1] = stacked.first_row[s] + batch.out[s];
  }
  stacked.total_rows = stacked.first_row[batch.count];
  if (stacked.total_rows == 0) return cudaSuccess;
  const auto count = static_cast<int32_t>(rows);
  cudaError_t status = cudaErrorInvalidValue;
  auto dispatch = [&](auto tag) {
    using W = decltype(tag);
    // One row's sums leave registers for four blocks per multiprocessor.
    if (rows == 1)
      status = launch<W, 1, 3, 4>(x, count, stacked, stream);
    else if (rows == 2)
      status = launch<W, 2, 3, 3>(x, count, stacked, stream);
    else if (rows <= 4)
      status = launch<W, 4, 2, 2>(x, count, stacked, stream);
    else
      status = launch<W, 8, 2, 2>(x, count, stacked, stream);
  };
  if (batch.dtype == DType::BF16) dispatch(__nv_bfloat16{});
  if (batch.dtype == DType::F16) dispatch(__half{});
  return status;
}

}  // namespace beamline::cuda
