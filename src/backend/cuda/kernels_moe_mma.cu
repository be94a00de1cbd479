// The experts on the tensor cores for a few to many tokens per expert. The weights are the big operand, so the
// GEMMs are "swapped": per expert C^T = W · X^T with the expert's weight rows as the MMA's M dimension (streamed
// once per tile of up to kTokenTile tokens, through a cp.async pipeline in shared memory) and the expert's tokens as
// N. X (h for gate|up, the F32 SwiGLU output for down) is read through the expert's slot list, never copied, and
// enters the MMA as two BF16 operands hi = bf16(x), lo = bf16(x - hi) accumulating into one F32 accumulator, so
// the products are as accurate as FP32 ones (the BF16 weights are exact).
//
// Bookkeeping without a host sync: one block groups the slots by expert and lists the (expert, token tile) pairs;
// the GEMM grids cover the most tiles there can be and the blocks past the listed ones return at once.
#include <algorithm>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace beamline::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTokenTile = 64;                 // tokens (N) of one tile: 8 MMA columns of 8
constexpr int kColumnGroups = kTokenTile / 8;
constexpr int kSubTileRows = kWarps * 16;      // weight rows of each of the block's two sub-tiles
constexpr int kBlockK = 64;
constexpr int kStages = 3;
constexpr int kWeightStride = kBlockK + 8;     // bf16 per staged row; the 16-byte skew keeps ldmatrix conflict-free
constexpr int kTokenStride = kBlockK + 8;      // floats per staged row; float2 reads of 8 rows hit distinct banks
constexpr int kWeightStageElements = 2 * kSubTileRows * kWeightStride;
constexpr int kTokenStageElements = kTokenTile * kTokenStride;
constexpr size_t kStageBytes = sizeof(__nv_bfloat16) * kWeightStageElements + sizeof(float) * kTokenStageElements;
constexpr size_t kSharedBytes = kStages * kStageBytes;
constexpr int kPlanThreads = 1024;

// One listed tile: the expert, its first entry in the grouped slot list and how many slots (1..kTokenTile).
struct Tile {
  int32_t expert, first, count, unused;
};

__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

__device__ __forceinline__ void copy_async16(void* shared, const void* global, bool valid) {
  const auto destination = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(global),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const __nv_bfloat16* address) {
  const auto shared = static_cast<unsigned>(__cvta_generic_to_shared(address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(shared));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// Two consecutive-k F32 values as hi and lo BF16 pairs (the lower k in the low half, as the MMA expects).
__device__ __forceinline__ void split_pair(float2 v, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 high = __floats2bfloat162_rn(v.x, v.y);
  const float2 rounded = __bfloat1622float2(high);
  hi = bits(high);
  lo = bits(__floats2bfloat162_rn(v.x - rounded.x, v.y - rounded.y));
}

// Groups the slots by expert (each expert's slots contiguous in `grouped`, in no particular order: every token is
// its own MMA column, so the order changes no result) and lists the tiles of up to kTokenTile slots per expert;
// the tiles past the listed ones get expert -1. Slots naming no valid expert are left out (the combine makes their
// token NaN).
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const int32_t* ids, int32_t assignments, int32_t experts,
                                                            int64_t max_tiles, int32_t* grouped, Tile* tiles) {
  __shared__ int32_t count[kMaxMmaExperts], first[kMaxMmaExperts], first_tile[kMaxMmaExperts];
  __shared__ int32_t listed_tiles;
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int32_t s = threadIdx.x; s < assignments; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // exclusive prefix sums of slots and tiles, 32 experts at a time
    const int lane = threadIdx.x;
    int32_t slot_base = 0, tile_base = 0;
    for (int32_t e0 = 0; e0 < experts; e0 += 32) {
      const int32_t e = e0 + lane;
      const int32_t slots = e < experts ? count[e] : 0;
      const int32_t expert_tiles = (slots + kTokenTile - 1) / kTokenTile;
      int32_t slot_sum = slots, tile_sum = expert_tiles;
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int32_t slot_up = __shfl_up_sync(0xffffffffu, slot_sum, offset);
        const int32_t tile_up = __shfl_up_sync(0xffffffffu, tile_sum, offset);
        if (lane >= offset) {
          slot_sum += slot_up;
          tile_sum += tile_up;
        }
      }
      if (e < experts) {
        first[e] = slot_base + slot_sum - slots;
        first_tile[e] = tile_base + tile_sum - expert_tiles;
      }
      slot_base += __shfl_sync(0xffffffffu, slot_sum, 31);
      tile_base += __shfl_sync(0xffffffffu, tile_sum, 31);
    }
    if (lane == 0) listed_tiles = tile_base;
  }
  __syncthreads();
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
    const int32_t slots = count[e];
    for (int32_t i = 0; i * kTokenTile < slots; ++i)
      tiles[first_tile[e] + i] = Tile{e, first[e] + i * kTokenTile, min(kTokenTile, slots - i * kTokenTile), 0};
  }
  for (int64_t t = listed_tiles + threadIdx.x; t < max_tiles; t += blockDim.x) tiles[t] = Tile{-1, 0, 0, 0};
  __syncthreads();  // `first` becomes each expert's cursor
  for (int32_t s = threadIdx.x; s < assignments; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < experts) grouped[atomicAdd(&first[e], 1)] = s;
  }
}

// One (tile, row block) of an expert GEMM, C[slot, row] for the tile's slots and the block's weight rows.
// kGateUp: the block owns rows [64 y, 64 y + 64) of gate and of up, X = h (row slot / top_k) and
// C = silu(gate · x) * (up · x). Else: rows [128 y, 128 y + 128) of down, X = the SwiGLU output (row slot) and
// C = weight[slot] * (down · x). Each warp computes 16 rows of both sub-tiles for all the tile's tokens, so the
// gate and up sums of one (row, token) meet in one thread.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 2)
    expert_gemm_kernel(const float* x, const int32_t* grouped, const Tile* tiles, int32_t top_k,
                       const void* const* first_table, const void* const* second_table, const float* weights,
                       int64_t m, int64_t k, float* c) {
  extern __shared__ __align__(16) unsigned char shared[];
  __shared__ int32_t source_row[kTokenTile], slot_of[kTokenTile];
  const Tile tile = tiles[blockIdx.x];
  if (tile.expert < 0) return;
  const int64_t row0 = int64_t{blockIdx.y} * (kGateUp ? kSubTileRows : 2 * kSubTileRows);
  if (row0 >= m) return;
  const __nv_bfloat16* matrix[2];
  int64_t sub_row0[2];
  if constexpr (kGateUp) {
    matrix[0] = static_cast<const __nv_bfloat16*>(first_table[tile.expert]);
    matrix[1] = static_cast<const __nv_bfloat16*>(second_table[tile.expert]);
    sub_row0[0] = sub_row0[1] = row0;
  } else {
    matrix[0] = matrix[1] = static_cast<const __nv_bfloat16*>(first_table[tile.expert]);
    sub_row0[0] = row0;
    sub_row0[1] = row0 + kSubTileRows;
  }
  const int columns = (tile.count + 7) / 8;  // MMA column groups holding tokens
  for (int n = threadIdx.x; n < kTokenTile; n += kThreads) {
    const int32_t slot = n < tile.count ? grouped[tile.first + n] : -1;
    slot_of[n] = slot;
    source_row[n] = slot < 0 ? -1 : kGateUp ? slot / top_k : slot;
  }
  __syncthreads();

  auto* weight_stages = reinterpret_cast<__nv_bfloat16*>(shared);
  auto* token_stages = reinterpret_cast<float*>(weight_stages + kStages * kWeightStageElements);
  const int64_t k_blocks = (k + kBlockK - 1) / kBlockK;
  // Rows and k past the ends are zero-filled, so they add exact zeros (padded tokens only reach their own columns).
  auto load_stage = [&](int stage, int64_t k_block) {
    const int64_t k0 = k_block * kBlockK;
    __nv_bfloat16* w = weight_stages + stage * kWeightStageElements;
#pragma unroll
    for (int sub = 0; sub < 2; ++sub)
      for (int i = threadIdx.x; i < kSubTileRows * (kBlockK / 8); i += kThreads) {
        const int r = i / (kBlockK / 8), chunk = i % (kBlockK / 8);
        const int64_t row = sub_row0[sub] + r, kk = k0 + chunk * 8;
        const bool valid = row < m && kk < k;
        copy_async16(w + (sub * kSubTileRows + r) * kWeightStride + chunk * 8,
                     valid ? matrix[sub] + row * k + kk : matrix[sub], valid);
      }
    float* t = token_stages + stage * kTokenStageElements;
    const int token_chunks = columns * 8 * (kBlockK / 4);
    for (int i = threadIdx.x; i < token_chunks; i += kThreads) {
      const int n = i / (kBlockK / 4), chunk = i % (kBlockK / 4);
      const int32_t source = source_row[n];
      const int64_t kk = k0 + chunk * 4;
      const bool valid = source >= 0 && kk < k;
      copy_async16(t + n * kTokenStride + chunk * 4, valid ? x + int64_t{source} * k + kk : x, valid);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float accumulator[2][kColumnGroups][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_blocks) load_stage(s, s);
    commit_copies();
  }
  for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
    wait_copies<kStages - 2>();
    __syncthreads();  // this stage landed for every thread, and the stage refilled below was read by every warp
    const int64_t next = k_block + kStages - 1;
    if (next < k_blocks) load_stage(static_cast<int>(next % kStages), next);
    commit_copies();
    const int stage = static_cast<int>(k_block % kStages);
    const __nv_bfloat16* w = weight_stages + stage * kWeightStageElements;
    const float* t = token_stages + stage * kTokenStageElements;
#pragma unroll
    for (int kk = 0; kk < kBlockK; kk += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int sub = 0; sub < 2; ++sub)
        load_a_fragment(a[sub], w + (sub * kSubTileRows + warp * 16 + (lane & 15)) * kWeightStride + kk +
                                    (lane >> 4) * 8);
#pragma unroll
      for (int g = 0; g < kColumnGroups; ++g) {
        if (g >= columns) break;
        const float* column = t + (g * 8 + lane / 4) * kTokenStride + kk + (lane % 4) * 2;
        uint32_t hi0, lo0, hi1, lo1;
        split_pair(*reinterpret_cast<const float2*>(column), hi0, lo0);
        split_pair(*reinterpret_cast<const float2*>(column + 8), hi1, lo1);
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          mma_bf16(accumulator[sub][g], a[sub], lo0, lo1);
          mma_bf16(accumulator[sub][g], a[sub], hi0, hi1);
        }
      }
    }
  }
  wait_copies<0>();

  // Accumulator element i of group g: row lane / 4 (+8 for i >= 2) of the warp's 16, token g * 8 + (lane % 4) * 2
  // (+1 for odd i).
#pragma unroll
  for (int g = 0; g < kColumnGroups; ++g) {
    if (g >= columns) break;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = g * 8 + (lane % 4) * 2 + (i & 1);
      if (n >= tile.count) continue;
      const int64_t slot = slot_of[n];
      const int row_in_sub = warp * 16 + lane / 4 + (i >= 2 ? 8 : 0);
      if constexpr (kGateUp) {
        const int64_t row = row0 + row_in_sub;
        if (row < m) c[slot * m + row] = silu(accumulator[0][g][i]) * accumulator[1][g][i];
      } else {
        const float weight = weights[slot];
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          const int64_t row = sub_row0[sub] + row_in_sub;
          if (row < m) c[slot * m + row] = weight * accumulator[sub][g][i];
        }
      }
    }
  }
}

// Once per process, outside any graph capture's stream work: the GEMMs' pipelines need more than 48 KiB.
cudaError_t allow_large_shared_memory() {
  for (auto* kernel : {expert_gemm_kernel<true>, expert_gemm_kernel<false>})
    if (cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(kSharedBytes));
        status != cudaSuccess)
      return status;
  return cudaSuccess;
}

}  // namespace

bool moe_mma_supported(DType dtype, int32_t experts, int64_t hidden, int64_t intermediate) {
  return dtype == DType::BF16 && experts <= kMaxMmaExperts && hidden % 8 == 0 && intermediate % 8 == 0;
}

int64_t moe_mma_max_tiles(int64_t assignments, int32_t experts) {
  // Every expert has at most one partial tile on top of its full ones.
  return assignments / kTokenTile + std::min<int64_t>(experts, assignments);
}

cudaError_t moe_mma(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                    const ExpertPointers& experts, const MoeMmaWorkspace& workspace, float* out,
                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int64_t assignments = rows * top_k;
  if (!moe_mma_supported(experts.dtype, experts.experts, experts.hidden, experts.intermediate) ||
      assignments > INT32_MAX || workspace.max_tiles < moe_mma_max_tiles(assignments, experts.experts))
    return cudaErrorInvalidValue;
  auto* tiles = reinterpret_cast<Tile*>(workspace.tiles);
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(ids, static_cast<int32_t>(assignments), experts.experts,
                                              workspace.max_tiles, workspace.grouped, tiles);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  static const cudaError_t configured = allow_large_shared_memory();
  if (configured != cudaSuccess) return configured;
  const auto tile_count = static_cast<unsigned int>(workspace.max_tiles);
  const dim3 up_grid(tile_count, blocks_for(experts.intermediate, kSubTileRows));
  expert_gemm_kernel<true><<<up_grid, kThreads, kSharedBytes, stream>>>(
      h, workspace.grouped, tiles, top_k, experts.gate, experts.up, weights, experts.intermediate, experts.hidden,
      workspace.activated);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  const dim3 down_grid(tile_count, blocks_for(experts.hidden, 2 * kSubTileRows));
  expert_gemm_kernel<false><<<down_grid, kThreads, kSharedBytes, stream>>>(
      workspace.activated, workspace.grouped, tiles, top_k, experts.down, experts.down, weights, experts.hidden,
      experts.intermediate, workspace.expert_out);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  return moe_combine(workspace.expert_out, ids, rows, top_k, experts.experts, experts.hidden, out, stream);
}

}  // namespace beamline::cuda
