// The routed experts: rows permuted per expert (padded to the tile height), grouped tensor-core GEMMs that read each
// tile's expert from device memory (so nothing waits for the host), the SwiGLU fused into the gate|up GEMM, and the
// weighted combine in j order.
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/split_operand.cuh"
#include "backend/cuda/rows/rows.h"
#include "backend/cuda/moe/moe.h"

namespace beamline::cuda {
namespace {

// ---- permutation ----
__global__ void count_kernel(const int32_t* ids, int64_t assignments, int32_t experts, int32_t* counts) {
  const int64_t slot = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (slot >= assignments) return;
  const int32_t e = ids[slot];
  if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
}

// One block: each expert's first padded row and the expert of every row tile (-1 past the used tiles).
__global__ void plan_kernel(const int32_t* counts, int32_t experts, int64_t max_tiles, int32_t* offsets,
                            int32_t* tile_expert) {
  __shared__ int32_t used_tiles;
  if (threadIdx.x == 0) {
    int32_t next = 0;
    for (int32_t e = 0; e < experts; ++e) {
      offsets[e] = next;
      next += (counts[e] + kGroupedTileRows - 1) / kGroupedTileRows * kGroupedTileRows;
    }
    used_tiles = next / kGroupedTileRows;
  }
  __syncthreads();
  for (int64_t tile = threadIdx.x; tile < max_tiles; tile += blockDim.x)
    if (tile >= used_tiles) tile_expert[tile] = -1;
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
    const int32_t first = offsets[e] / kGroupedTileRows;
    const int32_t tiles = (counts[e] + kGroupedTileRows - 1) / kGroupedTileRows;
    for (int32_t i = 0; i < tiles; ++i) tile_expert[first + i] = e;
  }
}

// One thread per (token, j): claims a row in its expert's range and records which token feeds it (the grouped
// GEMM reads h through this map, so the rows are never copied) and, when row_slot is set, which slot.
__global__ void scatter_kernel(const int32_t* ids, int64_t assignments, int32_t top_k, int32_t experts,
                               const int32_t* offsets, int32_t* cursor, int32_t* slot_row, int32_t* row_token,
                               int32_t* row_slot) {
  const int64_t slot = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (slot >= assignments) return;
  const int32_t e = ids[slot];
  if (e < 0 || e >= experts) {
    slot_row[slot] = -1;
    return;
  }
  const int32_t row = offsets[e] + atomicAdd(&cursor[e], 1);
  slot_row[slot] = row;
  row_token[row] = static_cast<int32_t>(slot / top_k);
  if (row_slot != nullptr) row_slot[row] = static_cast<int32_t>(slot);
}

__global__ void combine_kernel(const float* expert_out, const int32_t* slot_row, const float* weights, int32_t top_k,
                               int64_t hidden, float* out) {
  const int64_t token = blockIdx.x;
  bool valid = true;
  for (int32_t j = 0; j < top_k; ++j) valid = valid && slot_row[token * top_k + j] >= 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float sum = 0.0f;
    for (int32_t j = 0; j < top_k; ++j)
      if (valid) sum += weights[token * top_k + j] * expert_out[int64_t{slot_row[token * top_k + j]} * hidden + i];
    out[token * hidden + i] = valid ? sum : __int_as_float(0x7fc00000);
  }
}

// ---- grouped GEMM: C[r, n] = sum_k A[r, k] * B_e[n, k] for the rows of tile blockIdx.x, e its expert ----
// A is F32 and enters the tensor cores as kTerms operands in W (common/split_operand.cuh, done while staging the
// tile): kSplitTerms with OperandPrecision::Split, so the products are what FP32 arithmetic gives at three times the
// MMA work; two (hi + lo, about 17 bits) with Bf16, as this fallback has always done. These GEMMs are bound by
// streaming the expert weights.
constexpr int kTileN = 64, kTileK = 32, kGemmThreads = 128;
constexpr int kLoadStride = kTileK + 8;  // bf16/f16 rows padded to keep WMMA loads 16-byte aligned
constexpr int kStoreStride = kTileN + 4;

struct GroupedOperands {
  const void* const* b0_table = nullptr;  // per expert, used with tile_expert
  const void* const* b1_table = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* row_source = nullptr;  // row of A behind each row of C (-1: padding); null: the same row
  int64_t rows_limit = 0;               // rows of C that exist
  // ExpertDeltas::gate_up (kDual, [A, 2n]) or ::down ([A, n]) by slot, row_slot the slot of each row of C (-1:
  // padding); null: none.
  const float* delta = nullptr;
  const int32_t* row_slot = nullptr;
};

// f(m, i, j) for each of a warp's accumulator fragments: matrix m of kMatrices, 16 x 16 tile (i, j) of its 32 x 32.
template <int kMatrices, typename F>
__device__ __forceinline__ void for_each_fragment(F&& f) {
#pragma unroll
  for (int m = 0; m < kMatrices; ++m)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) f(m, i, j);
}

// kDual: C = silu(A B0ᵀ + dg) * (A B1ᵀ + du) (gate|up with the SwiGLU fused); else C = A B0ᵀ + d; the deltas of
// operands.delta, zero without.
template <typename W, bool kDual, int kTerms>
__global__ void __launch_bounds__(kGemmThreads) grouped_gemm_kernel(const float* a, GroupedOperands operands,
                                                                    int64_t n, int64_t k, float* c) {
  using namespace nvcuda;
  constexpr int kMatrices = kDual ? 2 : 1;
  constexpr size_t kLoadBytes = sizeof(W) * kLoadStride * (kTerms * kGroupedTileRows + kMatrices * kTileN);
  constexpr size_t kStoreBytes = sizeof(float) * kStoreStride * kGroupedTileRows * kMatrices;
  __shared__ __align__(128) unsigned char shared[kLoadBytes > kStoreBytes ? kLoadBytes : kStoreBytes];
  __shared__ int32_t source_row[kGroupedTileRows];
  W* a_terms = reinterpret_cast<W*>(shared);  // term t at a_terms + t * kATermElements
  constexpr int kATermElements = kGroupedTileRows * kLoadStride;
  W* b_tiles = a_terms + kTerms * kATermElements;
  float* c_tiles = reinterpret_cast<float*>(shared);

  const int64_t tile = blockIdx.x;
  const W* b[kMatrices];
  const int32_t expert = operands.tile_expert[tile];
  if (expert < 0) return;
  b[0] = static_cast<const W*>(operands.b0_table[expert]);
  if constexpr (kDual) b[1] = static_cast<const W*>(operands.b1_table[expert]);
  const int64_t row0 = tile * kGroupedTileRows, col0 = int64_t{blockIdx.y} * kTileN;
  const int warp = threadIdx.x / 32, warp_m = warp / 2, warp_n = warp % 2;
  for (int r = threadIdx.x; r < kGroupedTileRows; r += kGemmThreads) {
    const int64_t row = row0 + r;
    source_row[r] = row >= operands.rows_limit ? -1
                    : operands.row_source != nullptr ? operands.row_source[row]
                                                     : static_cast<int32_t>(row);
  }

  // With kSplitTerms terms each k tile's sums move into `total` by IEEE additions, so the tensor cores' truncating
  // FP32 accumulation never chains more than one tile of MMAs (moe_mma.cu does the same per stage).
  constexpr bool kPromote = kTerms == kSplitTerms;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> accumulator[kMatrices][2][2], total[kMatrices][2][2];
  for_each_fragment<kMatrices>([&](int m, int i, int j) {
    wmma::fill_fragment(accumulator[m][i][j], 0.0f);
    if constexpr (kPromote) wmma::fill_fragment(total[m][i][j], 0.0f);
  });

  const W zero = from_float<W>(0.0f);
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    __syncthreads();  // the previous tiles are consumed (and source_row is written before the first)
    for (int i = threadIdx.x; i < kGroupedTileRows * kTileK; i += kGemmThreads) {
      const int r = i / kTileK, kk = i % kTileK;
      const int32_t source = source_row[r];
      const float value = (k0 + kk < k && source >= 0) ? a[int64_t{source} * k + k0 + kk] : 0.0f;
      W terms[kTerms];
      split_terms(value, terms);
#pragma unroll
      for (int t = 0; t < kTerms; ++t) a_terms[t * kATermElements + r * kLoadStride + kk] = terms[t];
    }
#pragma unroll
    for (int m = 0; m < kMatrices; ++m)
      for (int i = threadIdx.x; i < kTileN * kTileK; i += kGemmThreads) {
        const int col = i / kTileK, kk = i % kTileK;
        b_tiles[(m * kTileN + col) * kLoadStride + kk] =
            (k0 + kk < k && col0 + col < n) ? b[m][(col0 + col) * k + k0 + kk] : zero;
      }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a_fragment[kTerms][2];
#pragma unroll
      for (int t = 0; t < kTerms; ++t)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(a_fragment[t][i],
                                 a_terms + t * kATermElements + (warp_m * 32 + i * 16) * kLoadStride + kk, kLoadStride);
#pragma unroll
      for (int m = 0; m < kMatrices; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> b_fragment;
          wmma::load_matrix_sync(b_fragment, b_tiles + (m * kTileN + warp_n * 32 + j * 16) * kLoadStride + kk,
                                 kLoadStride);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int t = kTerms - 1; t >= 0; --t)  // the smallest term first
              wmma::mma_sync(accumulator[m][i][j], a_fragment[t][i], b_fragment, accumulator[m][i][j]);
        }
    }
    if constexpr (kPromote) {
      for_each_fragment<kMatrices>([&](int m, int i, int j) {
#pragma unroll
        for (int e = 0; e < total[m][i][j].num_elements; ++e) {
          total[m][i][j].x[e] += accumulator[m][i][j].x[e];
          accumulator[m][i][j].x[e] = 0.0f;
        }
      });
    }
  }
  __syncthreads();

  for_each_fragment<kMatrices>([&](int m, int i, int j) {
    wmma::store_matrix_sync(
        c_tiles + (m * kGroupedTileRows + warp_m * 32 + i * 16) * kStoreStride + warp_n * 32 + j * 16,
        kPromote ? total[m][i][j] : accumulator[m][i][j], kStoreStride, wmma::mem_row_major);
  });
  __syncthreads();
  for (int i = threadIdx.x; i < kGroupedTileRows * kTileN; i += kGemmThreads) {
    const int r = i / kTileN, col = i % kTileN;
    const int64_t row = row0 + r;
    if (row >= operands.rows_limit || col0 + col >= n) continue;
    float value = c_tiles[r * kStoreStride + col];
    const int64_t slot = operands.delta != nullptr ? operands.row_slot[row] : -1;
    if constexpr (kDual) {
      float up = c_tiles[(kGroupedTileRows + r) * kStoreStride + col];
      if (slot >= 0) {
        value += operands.delta[2 * slot * n + col0 + col];
        up += operands.delta[(2 * slot + 1) * n + col0 + col];
      }
      c[row * n + col0 + col] = silu(value) * up;
    } else {
      if (slot >= 0) value += operands.delta[slot * n + col0 + col];
      c[row * n + col0 + col] = value;
    }
  }
}

// Counts, pads and maps the rows per expert into `workspace`: offsets, tile_expert, slot_row, row_token and (when set)
// row_slot, through which the grouped GEMMs read h and the deltas instead of copied rows.
cudaError_t map_rows(const int32_t* ids, int64_t assignments, int32_t top_k, int32_t experts,
                     const MoeWorkspace& workspace, cudaStream_t stream) {
  // `count` int32s of `data` with every byte `byte` (0: zeros; 0xff: -1); nothing for null (row_slot without deltas).
  const auto fill = [stream](int32_t* data, int byte, int64_t count) {
    return data != nullptr ? cudaMemsetAsync(data, byte, sizeof(int32_t) * count, stream) : cudaSuccess;
  };
  for (int32_t* counter : {workspace.counts, workspace.cursor})
    if (cudaError_t status = fill(counter, 0, experts); status != cudaSuccess) return status;
  count_kernel<<<blocks_for(assignments, 256), 256, 0, stream>>>(ids, assignments, experts, workspace.counts);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  plan_kernel<<<1, 1024, 0, stream>>>(workspace.counts, experts, workspace.max_tiles, workspace.offsets,
                                      workspace.tile_expert);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  // -1 for the padding rows, which no slot claims.
  for (int32_t* row_map : {workspace.row_token, workspace.row_slot})
    if (cudaError_t status = fill(row_map, 0xff, workspace.max_tiles * kGroupedTileRows); status != cudaSuccess)
      return status;
  scatter_kernel<<<blocks_for(assignments, 256), 256, 0, stream>>>(ids, assignments, top_k, experts, workspace.offsets,
                                                                   workspace.cursor, workspace.slot_row,
                                                                   workspace.row_token, workspace.row_slot);
  return cudaGetLastError();
}

// The gate|up GEMM (SwiGLU fused) into workspace.activated, the down delta's hook, then the down GEMM into
// workspace.expert_out, over the padded rows that the permutation laid out in `workspace`.
template <typename W, int kTerms>
cudaError_t run_swiglu_gemms(const float* h, const ExpertPointers& experts, const MoeWorkspace& workspace,
                             const ExpertDeltas* deltas, cudaStream_t stream) {
  GroupedOperands up_operands, down_operands;
  up_operands.b0_table = experts.gate;
  up_operands.b1_table = experts.up;
  down_operands.b0_table = experts.down;
  up_operands.tile_expert = down_operands.tile_expert = workspace.tile_expert;
  up_operands.row_source = workspace.row_token;
  up_operands.rows_limit = down_operands.rows_limit = workspace.max_tiles * kGroupedTileRows;
  up_operands.delta = gate_up_delta(deltas);
  down_operands.delta = down_delta(deltas);
  up_operands.row_slot = down_operands.row_slot = workspace.row_slot;
  const int64_t hidden = experts.hidden, intermediate = experts.intermediate;
  const auto tiles = static_cast<unsigned int>(workspace.max_tiles);
  grouped_gemm_kernel<W, true, kTerms><<<dim3(tiles, blocks_for(intermediate, kTileN)), kGemmThreads, 0, stream>>>(
      h, up_operands, intermediate, hidden, workspace.activated);
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  SwigluRows swiglu;
  swiglu.f32 = workspace.activated;
  swiglu.slot_row = workspace.slot_row;
  if (const cudaError_t status = compute_down_delta(deltas, swiglu); status != cudaSuccess) return status;
  grouped_gemm_kernel<W, false, kTerms><<<dim3(tiles, blocks_for(hidden, kTileN)), kGemmThreads, 0, stream>>>(
      workspace.activated, down_operands, hidden, intermediate, workspace.expert_out);
  return cudaGetLastError();
}

template <typename Body>
bool dispatch_tensor_core(DType dtype, Body&& body) {
  if (dtype == DType::BF16) {
    body(__nv_bfloat16{});
    return true;
  }
  if (dtype == DType::F16) {
    body(__half{});
    return true;
  }
  return false;
}

}  // namespace

int64_t moe_max_tiles(int64_t assignments, int32_t experts) {
  // Each expert pads its rows to whole tiles: at most one partial tile per expert on top of the full ones.
  return assignments / kGroupedTileRows + std::min<int64_t>(experts, assignments) + 1;
}

cudaError_t moe(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                const ExpertPointers& experts, OperandPrecision precision, const MoeWorkspace& workspace, float* out,
                cudaStream_t stream, const ExpertDeltas* deltas) {
  if (rows == 0) return cudaSuccess;
  if (deltas != nullptr && workspace.row_slot == nullptr) return cudaErrorInvalidValue;
  const int64_t assignments = rows * top_k;
  if (cudaError_t status = map_rows(ids, assignments, top_k, experts.experts, workspace, stream); status != cudaSuccess)
    return status;
  cudaError_t status = cudaErrorInvalidValue;
  dispatch_tensor_core(experts.dtype, [&](auto tag) {
    using W = decltype(tag);
    status = precision == OperandPrecision::Split
                 ? run_swiglu_gemms<W, kSplitTerms>(h, experts, workspace, deltas, stream)
                 : run_swiglu_gemms<W, 2>(h, experts, workspace, deltas, stream);
  });
  if (status != cudaSuccess) return status;
  combine_kernel<<<static_cast<unsigned int>(rows), 256, 0, stream>>>(workspace.expert_out, workspace.slot_row,
                                                                      weights, top_k, experts.hidden, out);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
