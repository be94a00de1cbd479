// The experts on the tensor cores for a few to many tokens per expert. The weights are the big operand, so the
// GEMMs are "swapped": per expert C^T = W · X^T with the expert's weight rows as the MMA's M dimension (streamed
// once per tile of up to 16 or 64 tokens, through a cp.async pipeline in shared memory) and the expert's tokens as
// N. One producer warp per block fills the stages with cp.async and signals each stage's "full" mbarrier when its
// copies land; the compute warps wait on that barrier alone and release the stage through an "empty" mbarrier, so
// no warp waits for the whole block at any k step and every stage but the one being read is in flight.
// X (h for gate|up, the F32 SwiGLU output for down) enters the MMA as BF16: with OperandPrecision::Split as the
// three operands hi, lo, lo2 of common/split_operand.cuh (their sum is x) accumulating into one F32 accumulator per
// stage, whose sums are then added into F32 registers, so the products are what FP32 arithmetic gives (the BF16
// weights are exact); with Bf16 as hi alone (one MMA per product, a third of the tensor-core work and no lo rows to
// stage). The conversion is done once per value, not per weight tile: h by split_f32 up front, the SwiGLU output in
// the gate|up epilogue; the GEMMs read the X rows through the expert's slot list (never copied) with ldmatrix, so the
// inner loop is loads and MMAs only.
//
// With OperandPrecision::Bf16 the same GEMMs run on Hopper's warpgroup MMAs instead (the wgmma section below: TMA
// weight tiles, larger N per instruction), faster at every token count measured; Split keeps mma.sync.
//
// Bookkeeping without a host sync: one block groups the slots by expert and lists the (expert, token tile) pairs;
// the GEMM grids cover the most tiles there can be and the blocks past the listed ones return at once.
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common/async_copy.cuh"
#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/mma_f16.cuh"
#include "backend/cuda/common/split_operand.cuh"
#include "backend/cuda/rows/rows.h"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/common/mbarrier.cuh"

namespace beamline::cuda {
namespace {

constexpr int kPlanThreads = 1024;
// Up to this many slots per expert on average, tiles of 16 tokens (smaller stages, so more of them in flight);
// above it, tiles of 64 tokens, so that an expert's weights are streamed once for more tokens.
constexpr int64_t kFewSlotsPerExpert = 4;
// Bf16 on wgmma: up to this many slots per expert on average, blocks of two warpgroups sharing the staged tokens;
// above it, the prefill tiles.
constexpr int64_t kSharedTokensSlotsPerExpert = 64;
constexpr int kSmallTile = 16, kLargeTile = 64;

// Dynamic shared memory of one block: two blocks per SM fit in the H100/H200's 228 KiB with the static arrays and
// the per-block reservation to spare.
constexpr size_t kStageBudgetBytes = 112 * 1024;

// The block of 16-token tiles, where the weight stream is all that counts: compute warps and k per stage.
constexpr int kSmallTileWarps = 4, kSmallTileK = 64;

// The block and pipeline of each tile size and precision: compute warps (each 16 rows of both weight sub-tiles),
// k per stage, stages, resident blocks per SM. The stages fill the budget, so the lo rows that Bf16 does not stage
// can become more stages. kTerms: X rows per token, 1 (Bf16: hi) or kSplitTerms (Split: hi, lo, lo2); with three
// sets of 64 tokens a 64-wide k stage would leave room for two stages only, so those stages are 32 wide.
template <int kTokens, int kTerms>
struct Pipeline {
  static constexpr int kWarps = kTokens <= kSmallTile ? kSmallTileWarps : 4;
  static constexpr int kThreads = (kWarps + 1) * 32;  // and the producer warp
  static constexpr int kSubTileRows = kWarps * 16;    // weight rows of each of the block's two sub-tiles
  static constexpr int kBlockK = kTokens <= kSmallTile ? kSmallTileK : kTerms > 1 ? 32 : 64, kBlocksPerSm = 2;
  static constexpr int kStride = kBlockK + 8;  // bf16 per staged row; the 16-byte skew keeps ldmatrix conflict-free
  // One stage: the two weight sub-tiles, then the tokens' hi rows, then (Split) their lo and lo2 rows.
  static constexpr int kStageElements = (2 * kSubTileRows + kTerms * kTokens) * kStride;
  static constexpr size_t kStageBytes = sizeof(__nv_bfloat16) * kStageElements;
  static constexpr int kStages = static_cast<int>(kStageBudgetBytes / kStageBytes);
  static constexpr size_t kSharedBytes = kStages * kStageBytes;
  static_assert(kStages >= 3, "the pipeline needs a stage in use and two in flight");
};

// One listed tile: the expert, its first entry in the grouped slot list and how many slots (1..tile size).
struct Tile {
  int32_t expert, first, count, unused;
};

// The SwiGLU output of gate|up as the down GEMM's operands: the kTerms BF16 row sets of its F32 values, set t at
// rows + t * term_stride.
struct SplitOutput {
  __nv_bfloat16* rows = nullptr;
  int64_t term_stride = 0;
};

// Four 8x8 BF16 matrices, lane l giving the address of row l % 8 of matrix l / 8; each lane gets two elements of
// every matrix (row lane / 4, columns (lane % 4) * 2 and + 1), the MMA's fragment layout for A and for B.
__device__ __forceinline__ void load_matrices(uint32_t (&a)[4], const __nv_bfloat16* address) {
  const auto shared = static_cast<unsigned>(__cvta_generic_to_shared(address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(shared));
}
// Two of them, lanes 0-15 giving the addresses (lane l: row l % 8 of matrix l / 8).
__device__ __forceinline__ void load_matrices(uint32_t (&b)[2], const __nv_bfloat16* address) {
  const auto shared = static_cast<unsigned>(__cvta_generic_to_shared(address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(b[0]), "=r"(b[1]) : "r"(shared));
}


// Groups the slots by expert (each expert's slots contiguous in `grouped`, in no particular order: every token is
// its own MMA column, so the order changes no result) and lists the tiles of up to kTokens slots per expert; the
// tiles past the listed ones get expert -1. Slots naming no valid expert are left out (the combine makes their
// token NaN).
template <int kTokens>
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
      const int32_t expert_tiles = (slots + kTokens - 1) / kTokens;
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
    for (int32_t i = 0; i * kTokens < slots; ++i)
      tiles[first_tile[e] + i] = Tile{e, first[e] + i * kTokens, min(kTokens, slots - i * kTokens), 0};
  }
  for (int64_t t = listed_tiles + threadIdx.x; t < max_tiles; t += blockDim.x) tiles[t] = Tile{-1, 0, 0, 0};
  __syncthreads();  // `first` becomes each expert's cursor
  for (int32_t s = threadIdx.x; s < assignments; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < experts) grouped[atomicAdd(&first[e], 1)] = s;
  }
}

// One (tile, row block) of an expert GEMM, C[slot, row] for the tile's slots and the block's weight rows; X comes
// as kTerms BF16 row sets (hi, then lo and lo2; set t at x + t * x_term_stride), read through the slot list.
// kGateUp: the block owns rows [R y, R y + R) of gate and of up (R = kSubTileRows), X = h (row slot / top_k),
// C = silu(gate · x) * (up · x), stored as the down GEMM's operands (kTerms row sets, split_out). Else: rows [2R y, 2R y + 2R) of down, X = the SwiGLU output (row slot), C = weight[slot] * (down · x)
// in F32. Each warp computes 16 rows of both sub-tiles for all the tile's tokens, so the gate and up sums
// of one (row, token) meet in one thread. `delta` (ExpertDeltas, null for none): gate|up adds delta[slot, row] and
// delta[slot, m + row] to the gate and up sums before the SwiGLU, down adds delta[slot, row] before the weight.
template <bool kGateUp, int kTokens, int kTerms>
__global__ void __launch_bounds__((Pipeline<kTokens, kTerms>::kThreads), (Pipeline<kTokens, kTerms>::kBlocksPerSm))
    expert_gemm_kernel(const __nv_bfloat16* x, int64_t x_term_stride, const int32_t* grouped,
                       const Tile* tiles, int32_t top_k, const void* const* first_table,
                       const void* const* second_table, const float* weights, const float* delta, int64_t m,
                       int64_t k, SplitOutput split_out, float* out) {
  constexpr int kColumnGroups = kTokens / 8;
  static_assert(kTerms == 1 || kTerms == kSplitTerms, "X enters as hi alone or as every split term");
  using Stages = Pipeline<kTokens, kTerms>;
  constexpr int kWarps = Stages::kWarps, kThreads = Stages::kThreads, kSubTileRows = Stages::kSubTileRows;
  constexpr int kBlockK = Stages::kBlockK, kStride = Stages::kStride;
  constexpr int kStageCount = Stages::kStages;
  constexpr int kElements = Stages::kStageElements;
  extern __shared__ __align__(16) unsigned char shared[];
  __shared__ int32_t source_row[kTokens], slot_of[kTokens];
  __shared__ uint64_t full[kStageCount], empty[kStageCount];  // stage landed / stage read by every compute warp
  const Tile tile = tiles[blockIdx.x];
  if (tile.expert < 0) return;
  const int64_t row0 = int64_t{blockIdx.y} * (kGateUp ? kSubTileRows : 2 * kSubTileRows);
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
  for (int n = threadIdx.x; n < kTokens; n += kThreads) {
    const int32_t slot = n < tile.count ? grouped[tile.first + n] : -1;
    slot_of[n] = slot;
    source_row[n] = slot < 0 ? -1 : kGateUp ? slot / top_k : slot;
  }
  if (threadIdx.x == 0)
    for (int s = 0; s < kStageCount; ++s) {
      init_mbarrier(&full[s], 32);  // each producer lane, when its copies of the stage landed
      init_mbarrier(&empty[s], kWarps);
    }
  __syncthreads();

  auto* stages = reinterpret_cast<__nv_bfloat16*>(shared);
  const int64_t k_blocks = (k + kBlockK - 1) / kBlockK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // By the producer warp's lanes. Rows and k past the ends are zero-filled, so they add exact zeros (padded tokens
  // only reach their own columns).
  auto load_stage = [&](int stage, int64_t k_block) {
    const int64_t k0 = k_block * kBlockK;
    __nv_bfloat16* base = stages + stage * kElements;
#pragma unroll
    for (int sub = 0; sub < 2; ++sub)
      for (int i = lane; i < kSubTileRows * (kBlockK / 8); i += 32) {
        const int r = i / (kBlockK / 8), chunk = i % (kBlockK / 8);
        const int64_t row = sub_row0[sub] + r, kk = k0 + chunk * 8;
        const bool valid = row < m && kk < k;
        copy_async16(base + (sub * kSubTileRows + r) * kStride + chunk * 8,
                     valid ? matrix[sub] + row * k + kk : matrix[sub], valid);
      }
    const int token_chunks = columns * 8 * (kBlockK / 8);
    for (int i = lane; i < token_chunks; i += 32) {
      const int n = i / (kBlockK / 8), chunk = i % (kBlockK / 8);
      const int32_t source = source_row[n];
      const int64_t kk = k0 + chunk * 8;
      const bool valid = source >= 0 && kk < k;
      const int64_t offset = valid ? int64_t{source} * k + kk : 0;
      __nv_bfloat16* hi_row = base + (2 * kSubTileRows + n) * kStride + chunk * 8;
#pragma unroll
      for (int t = 0; t < kTerms; ++t)
        copy_async16(hi_row + t * kTokens * kStride, x + t * x_term_stride + offset, valid);
    }
  };

  if (warp == kWarps) {
    for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
      const int stage = static_cast<int>(k_block % kStageCount);
      const auto use = static_cast<uint32_t>(k_block / kStageCount);
      wait_mbarrier(&empty[stage], (use & 1) ^ 1);
      load_stage(stage, k_block);
      arrive_mbarrier_when_copied(&full[stage]);
    }
    return;
  }

  float accumulator[2][kColumnGroups][4] = {};
  // Split: the tensor cores' FP32 accumulation is not IEEE (it truncates), and every k step adds kTerms MMAs to the
  // chain, so each stage's sums move into `total` by IEEE additions: the truncating chains stay one stage long.
  float total[2][kColumnGroups][4] = {};
  // The B matrices of one ldmatrix.x4: Split, k 0-7 and 8-15 of the hi rows then of the lo rows of one column
  // group (an ldmatrix.x2 at lo2_row adds the lo2 rows'); Bf16, k 0-7 and 8-15 of two neighbouring column groups.
  const int b_matrix = lane / 8;
  const int b_row = 2 * kSubTileRows + (b_matrix / 2) * (kTerms > 1 ? kTokens : 8) + lane % 8,
            b_column = (b_matrix % 2) * 8;
  for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
    const int stage = static_cast<int>(k_block % kStageCount);
    wait_mbarrier(&full[stage], static_cast<uint32_t>(k_block / kStageCount) & 1);
    const __nv_bfloat16* base = stages + stage * kElements;
#pragma unroll
    for (int kk = 0; kk < kBlockK; kk += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int sub = 0; sub < 2; ++sub)
        load_matrices(a[sub], base + (sub * kSubTileRows + warp * 16 + (lane & 15)) * kStride + kk +
                                    (lane >> 4) * 8);
      if constexpr (kTerms > 1) {
        const int lo2_row = 2 * kSubTileRows + 2 * kTokens + lane % 8;
#pragma unroll
        for (int g = 0; g < kColumnGroups; ++g) {
          if (g >= columns) break;
          uint32_t b[4], lo2[2];  // hi k 0-7, hi k 8-15, lo k 0-7, lo k 8-15; lo2 k 0-7, k 8-15
          load_matrices(b, base + (b_row + g * 8) * kStride + kk + b_column);
          load_matrices(lo2, base + (lo2_row + g * 8) * kStride + kk + b_column);
#pragma unroll
          for (int sub = 0; sub < 2; ++sub) {
            mma_bf16(accumulator[sub][g], a[sub], lo2[0], lo2[1]);
            mma_bf16(accumulator[sub][g], a[sub], b[2], b[3]);
            mma_bf16(accumulator[sub][g], a[sub], b[0], b[1]);
          }
        }
      } else {
        static_assert(kColumnGroups % 2 == 0, "column groups are loaded in pairs");
#pragma unroll
        for (int g = 0; g < kColumnGroups; g += 2) {
          if (g >= columns) break;
          // Group g + 1 may hold no token (its rows not staged this time): its sums are never stored.
          uint32_t b[4];  // group g k 0-7, k 8-15, group g + 1 k 0-7, k 8-15
          load_matrices(b, base + (b_row + g * 8) * kStride + kk + b_column);
#pragma unroll
          for (int sub = 0; sub < 2; ++sub) {
            mma_bf16(accumulator[sub][g], a[sub], b[0], b[1]);
            mma_bf16(accumulator[sub][g + 1], a[sub], b[2], b[3]);
          }
        }
      }
    }
    if constexpr (kTerms > 1) {
#pragma unroll
      for (int g = 0; g < kColumnGroups; ++g) {
        if (g >= columns) break;
#pragma unroll
        for (int sub = 0; sub < 2; ++sub)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            total[sub][g][i] += accumulator[sub][g][i];
            accumulator[sub][g][i] = 0.0f;
          }
      }
    }
    __syncwarp();  // every lane's reads of the stage are done before the producer may refill it
    if (lane == 0) arrive_mbarrier(&empty[stage]);
  }

  // Accumulator element i of group g: row lane / 4 (+8 for i >= 2) of the warp's 16, token g * 8 + (lane % 4) * 2
  // (+1 for odd i).
  const float(&sums)[2][kColumnGroups][4] = kTerms > 1 ? total : accumulator;
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
        if (row >= m) continue;
        float gate = sums[0][g][i], up = sums[1][g][i];
        if (delta != nullptr) {
          gate += delta[2 * slot * m + row];
          up += delta[(2 * slot + 1) * m + row];
        }
        const float value = silu(gate) * up;
        if constexpr (kTerms == 1) {
          split_out.rows[slot * m + row] = __float2bfloat16_rn(value);
        } else {
          __nv_bfloat16 terms[kSplitTerms];
          split_terms(value, terms);
#pragma unroll
          for (int t = 0; t < kSplitTerms; ++t) split_out.rows[t * split_out.term_stride + slot * m + row] = terms[t];
        }
      } else {
        const float weight = weights[slot];
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          const int64_t row = sub_row0[sub] + row_in_sub;
          if (row < m)
            out[slot * m + row] =
                weight * (delta != nullptr ? sums[sub][g][i] + delta[slot * m + row] : sums[sub][g][i]);
        }
      }
    }
  }
}

// ---- Hopper wgmma (OperandPrecision::Bf16) ----
// The same swapped GEMMs with warpgroup MMAs: each of a block's kConsumers warpgroups owns 64 rows of each of the
// two weight sub-tiles (the M of one wgmma), the tile's tokens are N in chunks of kChunkTokens (only the chunks
// holding tokens are multiplied), FP32 accumulators in registers. Both operands sit in shared memory K-major in the
// 128-byte swizzle that wgmma's matrix descriptors read: the weights arrive by TMA (2D boxes of 64 rows x 64 k
// through each expert matrix's tensor map; rows and k past the ends are zero-filled), the tokens by cp.async
// through the slot list into the same swizzle (the gather stays fused into the load), staged once for all the
// block's warpgroups. One producer warp fills the stages; a stage's "full" barrier completes when its TMA bytes and
// every lane's copies have landed.
constexpr int kWgmmaRows = 64;            // rows of one warpgroup's share of a sub-tile: one wgmma's M
constexpr int kWgmmaK = 64;               // k per stage: one 128-byte swizzle row
constexpr int kSwizzleBytes = 1024;       // 8 rows of 128 bytes: the swizzle pattern's period and alignment
constexpr int kBoxBytes = kWgmmaRows * kWgmmaK * 2;  // one TMA box

// kConsumers 1: two blocks per SM, so that one block's epilogue and pipeline fill overlap the other's loop. 2: the
// staged tokens serve twice the weight rows (half the token traffic from L2 per weight byte), one block per SM.
template <int kChunkTokens, int kChunks, int kConsumers>
struct WgmmaTiling {
  static_assert(kChunkTokens % 8 == 0 && kChunkTokens >= 8 && kChunkTokens <= 256, "wgmma's N");
  static_assert(kConsumers == 1 || kConsumers == 2, "the block shapes below");
  static constexpr int kThreads = 128 * kConsumers + 32;  // the consumer warpgroups, then the producer warp
  static constexpr int kBlocksPerSm = kConsumers == 1 ? 2 : 1;
  static constexpr int kRows = kWgmmaRows * kConsumers;  // rows of one sub-tile
  static constexpr int kSubTileBytes = kConsumers * kBoxBytes;
  static constexpr int kTokens = kChunkTokens * kChunks;
  static constexpr int kTokenBytes = kTokens * kWgmmaK * 2;
  static constexpr int kStageBytes = 2 * kSubTileBytes + kTokenBytes;  // both sub-tiles, then the tokens
  static constexpr size_t kStageBudget = kConsumers == 1 ? 96 * 1024 : 200 * 1024;
  static constexpr int kStages = static_cast<int>(kStageBudget / kStageBytes);
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageBytes + kSwizzleBytes;  // + aligning the base
  static_assert(kStageBytes % kSwizzleBytes == 0, "every operand tile starts on a swizzle period");
  static_assert(kStages >= 3, "the pipeline needs a stage in use and two in flight");
};

__device__ __forceinline__ void arrive_expecting(uint64_t* barrier, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

// Rows [row, row + 64) x k [k0, k0 + 64) of the matrix behind `tensor_map` into `shared` (swizzled), counted on
// `barrier`'s transaction bytes.
__device__ __forceinline__ void load_box(uint32_t shared, const void* tensor_map, int32_t k0, int32_t row,
                                         uint64_t* barrier, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(shared),
      "l"(tensor_map), "r"(k0), "r"(row), "r"(shared_address(barrier)), "l"(policy)
      : "memory");
}

// A K-major operand tile in the 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t matrix_descriptor(uint32_t shared) {
  constexpr uint64_t kGroupStride = kSwizzleBytes >> 4, kSwizzle128 = 1;
  return uint64_t{(shared & 0x3ffffu) >> 4} | uint64_t{1} << 16 | kGroupStride << 32 | kSwizzle128 << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most kPending of this warpgroup's committed MMA groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of accumulators across the asynchronous MMAs that write them.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x N, F32) += A (64 x 16) · B (16 x N), both read through descriptors; the accumulators were zeroed, so every
// step accumulates.
__device__ __forceinline__ void wgmma_bf16(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_bf16(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(1));
}

// One (tile, row block) of an expert GEMM as expert_gemm_kernel<kGateUp, kTokens, false> computes it, on wgmma:
// X = one BF16 row per token, C stored as the down GEMM's BF16 operand (gate|up) or as the weighted F32 expert output
// (down), `delta` added as there. `first_maps` / `second_maps`: the tensor maps of every expert's gate and up
// matrices, or its down matrix twice (sub-tile 1 then covers the block's second kRows rows). The grid is the listed
// tiles x `row_blocks` row blocks each, the row block fastest.
template <bool kGateUp, int kChunkTokens, int kChunks, int kConsumers>
__global__ void __launch_bounds__((WgmmaTiling<kChunkTokens, kChunks, kConsumers>::kThreads),
                                  (WgmmaTiling<kChunkTokens, kChunks, kConsumers>::kBlocksPerSm))
    expert_wgmma_kernel(const __nv_bfloat16* x, const int32_t* grouped, const Tile* tiles, int32_t top_k,
                        const unsigned char* first_maps, const unsigned char* second_maps, const float* weights,
                        const float* delta, int64_t m, int64_t k, unsigned int row_blocks, __nv_bfloat16* activated,
                        float* out) {
  using Tiling = WgmmaTiling<kChunkTokens, kChunks, kConsumers>;
  constexpr int kTokens = Tiling::kTokens, kStageCount = Tiling::kStages, kStageBytes = Tiling::kStageBytes;
  constexpr int kThreads = Tiling::kThreads, kRows = Tiling::kRows, kSubTileBytes = Tiling::kSubTileBytes;
  constexpr int kFragment = kChunkTokens / 2;  // accumulators per thread of one 64 x kChunkTokens wgmma
  extern __shared__ unsigned char shared[];
  __shared__ int32_t source_row[kTokens], slot_of[kTokens];
  __shared__ uint64_t full[kStageCount], empty[kStageCount];
  // The row block is the fast grid index, so the blocks resident at once share a few tiles: each tile's tokens are
  // read from DRAM about once and then from L2 by its other row blocks, and one expert's tiles run together.
  const Tile tile = tiles[blockIdx.x / row_blocks];
  if (tile.expert < 0) return;
  const int64_t row0 = int64_t{blockIdx.x % row_blocks} * (kGateUp ? kRows : 2 * kRows);
  const int64_t sub_row0[2] = {row0, kGateUp ? row0 : row0 + kRows};
  const int chunks = (tile.count + kChunkTokens - 1) / kChunkTokens;  // chunks holding tokens
  for (int n = threadIdx.x; n < kTokens; n += kThreads) {
    const int32_t slot = n < tile.count ? grouped[tile.first + n] : -1;
    slot_of[n] = slot;
    source_row[n] = slot < 0 ? -1 : kGateUp ? slot / top_k : slot;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStageCount; ++s) {
      init_mbarrier(&full[s], 32 + 1);  // each producer lane's copies, and the arrival that expects the TMA bytes
      init_mbarrier(&empty[s], 4 * kConsumers);  // each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();

  const uint32_t stages = (shared_address(shared) + kSwizzleBytes - 1) & ~uint32_t{kSwizzleBytes - 1};
  const int64_t k_blocks = (k + kWgmmaK - 1) / kWgmmaK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 4 * kConsumers) {
    const void* map[2] = {first_maps + size_t{kTensorMapBytes} * tile.expert,
                          second_maps + size_t{kTensorMapBytes} * tile.expert};
    if (lane < 2) asm volatile("prefetch.tensormap [%0];\n" ::"l"(lane == 0 ? map[0] : map[1]) : "memory");
    // A weight box is read only by the blocks of its expert's tiles, which run at about the same time, so it may
    // leave L2 first, ahead of the token rows that the tile's other row blocks re-read. (An evict_normal policy
    // measured 10-13% slower at 16-256 tokens than evict_first, which ran as fast as no hint there.)
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    const int token_copies = chunks * kChunkTokens * (kWgmmaK / 8);  // 16-byte pieces of the staged token rows
    for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
      const int stage = static_cast<int>(k_block % kStageCount);
      const auto use = static_cast<uint32_t>(k_block / kStageCount);
      wait_mbarrier(&empty[stage], (use & 1) ^ 1);
      const uint32_t base = stages + stage * kStageBytes;
      const auto k0 = static_cast<int32_t>(k_block * kWgmmaK);
      if (lane == 0) {
        arrive_expecting(&full[stage], 2 * kSubTileBytes);
        for (int sub = 0; sub < 2; ++sub)
          for (int group = 0; group < kConsumers; ++group)
            load_box(base + sub * kSubTileBytes + group * kBoxBytes, map[sub], k0,
                     static_cast<int32_t>(sub_row0[sub] + group * kWgmmaRows), &full[stage], policy);
      }
      // Token n's 16-byte piece c goes to piece c ^ (n % 8) of its 128-byte row: the swizzle TMA applies to the
      // weights. Tokens past the tile's count and k past the end are zeros.
      for (int i = lane; i < token_copies; i += 32) {
        const int n = i / (kWgmmaK / 8), piece = i % (kWgmmaK / 8);
        const int32_t source = source_row[n];
        const int64_t kk = k0 + piece * 8;
        const bool valid = source >= 0 && kk < k;
        copy_async16(base + 2 * kSubTileBytes + n * (kWgmmaK * 2) + ((piece ^ (n % 8)) * 16),
                     valid ? x + int64_t{source} * k + kk : x, valid);
      }
      arrive_mbarrier_when_copied(&full[stage]);
    }
    return;
  }

  const int group = warp / 4;  // this warpgroup's rows: [group * 64, group * 64 + 64) of each sub-tile
  float accumulator[2][kChunks][kFragment];
#pragma unroll
  for (int sub = 0; sub < 2; ++sub)
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int i = 0; i < kFragment; ++i) accumulator[sub][c][i] = 0.0f;
  // The k loop for a tile whose tokens fill the first `used` chunks: the number of MMAs per step is fixed in each
  // copy, so nothing but MMAs lies between a step's first and last (no fence the compiler must inject).
  auto multiply = [&](auto used) {
    constexpr int kUsed = decltype(used)::value;
    for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
      const int stage = static_cast<int>(k_block % kStageCount);
      wait_mbarrier(&full[stage], static_cast<uint32_t>(k_block / kStageCount) & 1);
      // The token rows were written by cp.async (the generic proxy); wgmma reads them through the async proxy.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      const uint32_t base = stages + stage * kStageBytes;
#pragma unroll
      for (int sub = 0; sub < 2; ++sub)
#pragma unroll
        for (int c = 0; c < kUsed; ++c) fence_accumulators(accumulator[sub][c]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kWgmmaK / 16; ++kk)  // 16 k = 32 bytes along the swizzled rows
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          const uint64_t a = matrix_descriptor(base + sub * kSubTileBytes + group * kBoxBytes + kk * 32);
#pragma unroll
          for (int c = 0; c < kUsed; ++c)
            wgmma_bf16(accumulator[sub][c], a,
                       matrix_descriptor(base + 2 * kSubTileBytes + c * kChunkTokens * (kWgmmaK * 2) + kk * 32));
        }
      wgmma_commit();
      // This step's MMAs stay in flight while the warp waits for the next stage; the previous step's are done, so
      // their stage goes back to the producer. (The last stage is never released: nothing refills it.)
      wgmma_wait<1>();
#pragma unroll
      for (int sub = 0; sub < 2; ++sub)
#pragma unroll
        for (int c = 0; c < kUsed; ++c) fence_accumulators(accumulator[sub][c]);
      if (k_block > 0 && lane == 0)
        arrive_mbarrier(&empty[static_cast<int>((k_block + kStageCount - 1) % kStageCount)]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int sub = 0; sub < 2; ++sub)
#pragma unroll
      for (int c = 0; c < kUsed; ++c) fence_accumulators(accumulator[sub][c]);
  };
  static_assert(kChunks == 2 || kChunks == 4, "the tile sizes dispatched below");
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (chunks == 1) {
    multiply(One{});
  } else if constexpr (kChunks == 2) {
    multiply(Two{});
  } else if (chunks == 2) {
    multiply(Two{});
  } else if (chunks == 3) {
    multiply(std::integral_constant<int, 3>{});
  } else {
    multiply(std::integral_constant<int, 4>{});
  }

  // Accumulator i of chunk c: row warp * 16 + lane / 4 (+8 when i % 4 >= 2) of the sub-tile, token
  // c * kChunkTokens + (i / 4) * 8 + (lane % 4) * 2 (+1 for odd i).
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= chunks) break;
#pragma unroll
    for (int i = 0; i < kFragment; ++i) {
      const int n = c * kChunkTokens + (i / 4) * 8 + (lane % 4) * 2 + (i & 1);
      if (n >= tile.count) continue;
      const int64_t slot = slot_of[n];
      const int row_in_sub = warp * 16 + lane / 4 + (i % 4 >= 2 ? 8 : 0);  // warp = group * 4 + warp in group
      if constexpr (kGateUp) {
        const int64_t row = row0 + row_in_sub;
        if (row >= m) continue;
        float gate = accumulator[0][c][i], up = accumulator[1][c][i];
        if (delta != nullptr) {
          gate += delta[2 * slot * m + row];
          up += delta[(2 * slot + 1) * m + row];
        }
        activated[slot * m + row] = __float2bfloat16_rn(silu(gate) * up);
      } else {
        const float weight = weights[slot];
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          const int64_t row = sub_row0[sub] + row_in_sub;
          if (row < m)
            out[slot * m + row] = weight * (delta != nullptr ? accumulator[sub][c][i] + delta[slot * m + row]
                                                             : accumulator[sub][c][i]);
        }
      }
    }
  }
}

template <int kTokens>
int64_t tile_bound(int64_t assignments, int32_t experts) {
  // Every expert has at most one partial tile on top of its full ones.
  return assignments / kTokens + std::min<int64_t>(experts, assignments);
}

// Once per process, tile size and precision, outside any graph capture's stream work: the pipelines need more than
// 48 KiB.
template <int kTokens, int kTerms>
cudaError_t allow_large_shared_memory() {
  const auto bytes = static_cast<int>(Pipeline<kTokens, kTerms>::kSharedBytes);
  if (cudaError_t status = cudaFuncSetAttribute(expert_gemm_kernel<true, kTokens, kTerms>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      status != cudaSuccess)
    return status;
  return cudaFuncSetAttribute(expert_gemm_kernel<false, kTokens, kTerms>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}

template <int kTokens, int kTerms>
cudaError_t run_experts(const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                        const ExpertPointers& experts, const MoeMmaWorkspace& workspace, const ExpertDeltas* deltas,
                        cudaStream_t stream) {
  using Stages = Pipeline<kTokens, kTerms>;
  static const cudaError_t configured = allow_large_shared_memory<kTokens, kTerms>();
  const int64_t assignments = rows * top_k;
  if (configured != cudaSuccess) return configured;
  const int64_t max_tiles = tile_bound<kTokens>(assignments, experts.experts);
  auto* tiles = reinterpret_cast<Tile*>(workspace.tiles);
  plan_kernel<kTokens><<<1, kPlanThreads, 0, stream>>>(ids, static_cast<int32_t>(assignments), experts.experts,
                                                       max_tiles, workspace.grouped, tiles);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  const auto tile_count = static_cast<unsigned int>(max_tiles);
  auto* activated = static_cast<__nv_bfloat16*>(workspace.activated);
  const int64_t activated_stride = assignments * experts.intermediate;  // elements per term's row set
  const dim3 up_grid(tile_count, blocks_for(experts.intermediate, Stages::kSubTileRows));
  expert_gemm_kernel<true, kTokens, kTerms><<<up_grid, Stages::kThreads, Stages::kSharedBytes, stream>>>(
      static_cast<const __nv_bfloat16*>(workspace.h), rows * experts.hidden, workspace.grouped, tiles, top_k,
      experts.gate, experts.up, weights, gate_up_delta(deltas), experts.intermediate, experts.hidden,
      SplitOutput{activated, activated_stride}, nullptr);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  SwigluRows swiglu;
  swiglu.terms = activated;
  swiglu.term_count = kTerms;
  swiglu.term_stride = activated_stride;
  if (cudaError_t status = compute_down_delta(deltas, swiglu); status != cudaSuccess) return status;
  const dim3 down_grid(tile_count, blocks_for(experts.hidden, 2 * Stages::kSubTileRows));
  expert_gemm_kernel<false, kTokens, kTerms><<<down_grid, Stages::kThreads, Stages::kSharedBytes, stream>>>(
      activated, activated_stride, workspace.grouped, tiles, top_k, experts.down, experts.down, weights,
      down_delta(deltas), experts.hidden, experts.intermediate, SplitOutput{}, workspace.expert_out);
  return cudaGetLastError();
}


// Once per process and configuration, outside any graph capture's stream work (more than 48 KiB per block).
template <int kChunkTokens, int kChunks, int kConsumers>
cudaError_t allow_wgmma_shared_memory() {
  const auto bytes = static_cast<int>(WgmmaTiling<kChunkTokens, kChunks, kConsumers>::kSharedBytes);
  if (cudaError_t status = cudaFuncSetAttribute(expert_wgmma_kernel<true, kChunkTokens, kChunks, kConsumers>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      status != cudaSuccess)
    return status;
  return cudaFuncSetAttribute(expert_wgmma_kernel<false, kChunkTokens, kChunks, kConsumers>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int kChunkTokens, int kChunks, int kConsumers>
cudaError_t run_experts_wgmma(const int32_t* ids, const float* weights, int64_t assignments, int32_t top_k,
                              const ExpertPointers& experts, const MoeMmaWorkspace& workspace,
                              const ExpertDeltas* deltas, cudaStream_t stream) {
  using Tiling = WgmmaTiling<kChunkTokens, kChunks, kConsumers>;
  constexpr int kTokens = Tiling::kTokens;
  static const cudaError_t configured = allow_wgmma_shared_memory<kChunkTokens, kChunks, kConsumers>();
  if (configured != cudaSuccess) return configured;
  const int64_t max_tiles = tile_bound<kTokens>(assignments, experts.experts);
  auto* tiles = reinterpret_cast<Tile*>(workspace.tiles);
  plan_kernel<kTokens><<<1, kPlanThreads, 0, stream>>>(ids, static_cast<int32_t>(assignments), experts.experts,
                                                       max_tiles, workspace.grouped, tiles);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  const int64_t up_rows = blocks_for(experts.intermediate, Tiling::kRows);
  const int64_t down_rows = blocks_for(experts.hidden, 2 * Tiling::kRows);
  if (max_tiles * std::max(up_rows, down_rows) > INT32_MAX) return cudaErrorInvalidValue;  // one grid dimension
  const auto* maps = static_cast<const unsigned char*>(experts.tensor_maps);
  const size_t matrix_maps = size_t{kTensorMapBytes} * experts.experts;  // one matrix of every expert
  auto* activated = static_cast<__nv_bfloat16*>(workspace.activated);
  expert_wgmma_kernel<true, kChunkTokens, kChunks, kConsumers>
      <<<static_cast<unsigned int>(max_tiles * up_rows), Tiling::kThreads, Tiling::kSharedBytes, stream>>>(
          static_cast<const __nv_bfloat16*>(workspace.h), workspace.grouped, tiles, top_k, maps,
          maps + matrix_maps, weights, gate_up_delta(deltas), experts.intermediate, experts.hidden,
          static_cast<unsigned int>(up_rows), activated, nullptr);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  SwigluRows swiglu;
  swiglu.terms = activated;
  swiglu.term_count = 1;
  if (cudaError_t status = compute_down_delta(deltas, swiglu); status != cudaSuccess) return status;
  expert_wgmma_kernel<false, kChunkTokens, kChunks, kConsumers>
      <<<static_cast<unsigned int>(max_tiles * down_rows), Tiling::kThreads, Tiling::kSharedBytes, stream>>>(
          activated, workspace.grouped, tiles, top_k, maps + 2 * matrix_maps, maps + 2 * matrix_maps, weights,
          down_delta(deltas), experts.hidden, experts.intermediate, static_cast<unsigned int>(down_rows), nullptr,
          workspace.expert_out);
  return cudaGetLastError();
}

}  // namespace

bool moe_mma_supported(DType dtype, int32_t experts, int64_t hidden, int64_t intermediate) {
  return dtype == DType::BF16 && experts <= kMaxMmaExperts && hidden % 8 == 0 && intermediate % 8 == 0;
}

cudaError_t encode_expert_tensor_map(const void* weight, int64_t rows, int64_t cols, void* map) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  static const Encode encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return Encode{nullptr};
    return reinterpret_cast<Encode>(function);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  static_assert(sizeof(CUtensorMap) == kTensorMapBytes, "the tensor map tables' stride");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_stride[1] = {static_cast<cuuint64_t>(cols) * sizeof(__nv_bfloat16)};
  const cuuint32_t box[2] = {kWgmmaK, kWgmmaRows}, element_strides[2] = {1, 1};
  CUtensorMap encoded;
  const CUresult result =
      encode(&encoded, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(weight), dims, row_stride, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) return cudaErrorInvalidValue;
  std::memcpy(map, &encoded, sizeof(encoded));
  return cudaSuccess;
}

int64_t moe_tile_bound(int64_t assignments, int32_t experts, int32_t tile_tokens) {
  return assignments / tile_tokens + std::min<int64_t>(experts, assignments);
}

cudaError_t moe_group_slots(const int32_t* ids, int64_t assignments, int32_t experts, int32_t tile_tokens,
                            int64_t max_tiles, int32_t* grouped, int32_t* tiles, cudaStream_t stream) {
  if (experts > kMaxMmaExperts || assignments > INT32_MAX || max_tiles < moe_tile_bound(assignments, experts, tile_tokens))
    return cudaErrorInvalidValue;
  auto launch = [&](auto tokens) {
    plan_kernel<decltype(tokens)::value><<<1, kPlanThreads, 0, stream>>>(
        ids, static_cast<int32_t>(assignments), experts, max_tiles, grouped, reinterpret_cast<Tile*>(tiles));
    return cudaGetLastError();
  };
  switch (tile_tokens) {
    case 8: return launch(std::integral_constant<int, 8>{});
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    default: return cudaErrorInvalidValue;
  }
}

int64_t moe_mma_max_tiles(int64_t assignments, int32_t experts) {
  return tile_bound<kSmallTile>(assignments, experts);
}

cudaError_t moe_mma(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                    const ExpertPointers& experts, OperandPrecision precision, const MoeMmaWorkspace& workspace,
                    float* out, cudaStream_t stream, const ExpertDeltas* deltas) {
  if (rows == 0) return cudaSuccess;
  const int64_t assignments = rows * top_k;
  if (!moe_mma_supported(experts.dtype, experts.experts, experts.hidden, experts.intermediate) ||
      assignments > INT32_MAX || workspace.max_tiles < moe_mma_max_tiles(assignments, experts.experts))
    return cudaErrorInvalidValue;
  const bool split = precision == OperandPrecision::Split;
  if (cudaError_t status = split_f32(h, rows * experts.hidden, workspace.h, operand_terms(precision), DType::BF16, stream);
      status != cudaSuccess)
    return status;
  const bool few = assignments <= kFewSlotsPerExpert * experts.experts;
  const int64_t slots_per_expert = assignments / experts.experts;  // on average
  // Bf16 on wgmma wherever measured faster than the mma.sync kernels (at every size from 16 to 8192 tokens on
  // Beam-1.0 shapes; the variants and their times are in bench/results/2026-12-01-moe-wgmma.md). Up to 4 slots per
  // expert (128 tokens): one warpgroup per block, N in chunks of 16 (chunks of 32 were slower). Up to 64: two
  // warpgroups per block share the staged tokens. Prefill: one warpgroup, 128-token tiles in chunks of 64 (chunks of
  // 16 or 32, two warpgroups or one N = 128 MMA were slower).
  const cudaError_t status =
      !split && experts.tensor_maps != nullptr
          ? (slots_per_expert <= kFewSlotsPerExpert
                 ? run_experts_wgmma<16, 4, 1>(ids, weights, assignments, top_k, experts, workspace, deltas, stream)
             : slots_per_expert <= kSharedTokensSlotsPerExpert
                 ? run_experts_wgmma<16, 4, 2>(ids, weights, assignments, top_k, experts, workspace, deltas, stream)
                 : run_experts_wgmma<64, 2, 1>(ids, weights, assignments, top_k, experts, workspace, deltas, stream))
      : split ? (few ? run_experts<kSmallTile, kSplitTerms>(ids, weights, rows, top_k, experts, workspace, deltas, stream)
                     : run_experts<kLargeTile, kSplitTerms>(ids, weights, rows, top_k, experts, workspace, deltas, stream))
              : (few ? run_experts<kSmallTile, 1>(ids, weights, rows, top_k, experts, workspace, deltas, stream)
                     : run_experts<kLargeTile, 1>(ids, weights, rows, top_k, experts, workspace, deltas, stream));
  if (status != cudaSuccess) return status;
  return moe_combine(workspace.expert_out, ids, rows, top_k, experts.experts, experts.hidden, out, stream);
}

}  // namespace beamline::cuda
