// Prefill attention on the tensor cores for head_dim 128 and a BF16 KV pool with F32 operands split exactly
// (OperandPrecision::Split; Bf16 operands take the wgmma kernel, attention/prefill_wgmma.cu), in the
// FlashAttention-2 design: a block serves kVectors query vectors — (row, head of the group) pairs of consecutive
// rows of one sequence and one kv head, as in the CUDA-core kernel (attention/prefill.cu) — so every K/V
// tile is shared by the whole GQA group. K/V tiles of kKeys keys are copied with cp.async into XOR-swizzled shared
// memory (16-byte chunks, so ldmatrix reads 8 rows without bank conflicts), kStages - 1 tiles ahead of the one in
// use. Each warp owns 16 * kMTiles vectors: S = q Kᵀ and O += P V are mma.sync m16n8k16 BF16 products with FP32
// accumulation, the online softmax stays in registers and P goes from the S accumulators to the PV operand
// without shared memory. q and P enter as their kSplitTerms BF16 terms hi, lo, lo2 (common/split_operand.cuh: the
// terms sum to the F32 value, so three MMAs per product give what FP32 arithmetic gives); K and V are BF16 in the
// pool, exact operands.
// Key tiles that no vector of a warp sees are skipped by that warp; masks (causal, window, keys past the sequence)
// are applied only to tiles that are not wholly visible to every vector of the warp.
#include <climits>
#include <cmath>

#include "backend/cuda/common/async_copy.cuh"
#include "backend/cuda/common/split_operand.cuh"
#include "backend/cuda/attention/attention_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kDim = kFastHeadDim;
constexpr int kRowBytes = kDim * 2;  // a BF16 row of q, K or V
constexpr int kChunks = kRowBytes / 16;
constexpr int kVectors = kPrefillTileVectors;       // query vectors per block
constexpr float kLog2e = 1.4426950408889634f;

// The block's shape: the fastest of the spill-free shapes measured on the H200 (bench/results/
// 2026-12-01-prefill.md, measured with two terms). The terms of q and P make kSplitTerms MMAs per K/V fragment read
// from shared memory, so one 16-vector MMA tile per warp (8 warps) leaves registers for 64-key tiles, 3 deep, one
// block per multiprocessor.
constexpr int kQueryParts = kSplitTerms;  // q as BF16 rows: hi, lo, lo2
constexpr int kMTiles = 1;
constexpr int kWarps = kVectors / (16 * kMTiles);
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 64;   // keys per tile
constexpr int kStages = 3;  // K/V tiles in flight or in use
constexpr int kStageBytes = 2 * kKeys * kRowBytes;  // K then V
constexpr int kLoadsPerThread = kKeys * kChunks / kThreads;  // 16-byte chunks of K (and of V) per tile
constexpr size_t kSharedBytes = size_t{kQueryParts} * kVectors * kRowBytes + size_t{kStages} * kStageBytes;
static_assert(kLoadsPerThread * kThreads == kKeys * kChunks, "K/V tiles split evenly over the threads");

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRowBytes rows: chunks are XOR-swizzled by the
// row's low 3 bits, so the 8 rows one ldmatrix matrix reads fall into 8 distinct bank groups.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a (16 x 16, row-major) * b (16 x 8, column-major), BF16 operands, FP32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kThreads)
    prefill_attention_mma_kernel(const float* q, PoolGeometry pool, int32_t slot, BatchGeometry batch,
                                 const int32_t* tile_list, int32_t num_heads, float scale, int32_t sliding_window,
                                 float* out) {
  extern __shared__ __align__(128) unsigned char shared[];
  unsigned char* stages = shared + kQueryParts * kVectors * kRowBytes;
  __shared__ int key_missing[kStages][kKeys];
  __shared__ int range_first, range_last;

  const int32_t sequence = tile_list[3 * blockIdx.x], first_row = tile_list[3 * blockIdx.x + 1];
  const int32_t tile_rows = tile_list[3 * blockIdx.x + 2];
  const int32_t kv_head = blockIdx.y, group = num_heads / pool.num_kv_heads;
  const int32_t vectors = tile_rows * group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_first_vector = warp * 16 * kMTiles;
  const int64_t seq_len = batch.seq_lens[sequence];

  if (threadIdx.x == 0) {
    range_first = INT_MAX;
    range_last = -1;
  }
  for (int index = threadIdx.x; index < kVectors * kDim / 4; index += kThreads) {
    const int vector = index / (kDim / 4), d = index % (kDim / 4) * 4;
    float4 value{0.0f, 0.0f, 0.0f, 0.0f};
    if (vector < vectors) {
      const int64_t row = first_row + vector / group;
      const int32_t head = kv_head * group + vector % group;
      value = *reinterpret_cast<const float4*>(q + (row * num_heads + head) * kDim + d);
    }
    const uint32_t offset = swizzled(vector, d / 8) + (d % 8) * 2;
    uint32_t first[kQueryParts], second[kQueryParts];
    split_pair(value.x, value.y, first);
    split_pair(value.z, value.w, second);
#pragma unroll
    for (int part = 0; part < kQueryParts; ++part)
      *reinterpret_cast<uint2*>(shared + part * kVectors * kRowBytes + offset) = uint2{first[part], second[part]};
  }

  // This thread's vectors are rows lane / 4 (half 0) and lane / 4 + 8 (half 1) of each of the warp's MMA tiles;
  // their visible keys are [lowest, highest] (empty for padding vectors). The warp's bounds over its non-empty
  // vectors decide which tiles it skips and which it masks; the block's decide the tiles loaded.
  int32_t lowest[kMTiles][2], highest[kMTiles][2];
  int32_t lowest_min = INT_MAX, lowest_max = -1, highest_min = INT_MAX, highest_max = -1;
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int vector = warp_first_vector + 16 * i + 8 * h + lane / 4;
      lowest[i][h] = 1;
      highest[i][h] = 0;
      if (vector < vectors) {
        const int64_t position = batch.positions[first_row + vector / group];
        lowest[i][h] =
            sliding_window > 0 ? static_cast<int32_t>(max(int64_t{0}, position - sliding_window + 1)) : 0;
        highest[i][h] = static_cast<int32_t>(min(position, seq_len - 1));
      }
      if (lowest[i][h] <= highest[i][h]) {
        lowest_min = min(lowest_min, lowest[i][h]);
        lowest_max = max(lowest_max, lowest[i][h]);
        highest_min = min(highest_min, highest[i][h]);
        highest_max = max(highest_max, highest[i][h]);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    lowest_min = min(lowest_min, __shfl_xor_sync(0xffffffffu, lowest_min, offset));
    lowest_max = max(lowest_max, __shfl_xor_sync(0xffffffffu, lowest_max, offset));
    highest_min = min(highest_min, __shfl_xor_sync(0xffffffffu, highest_min, offset));
    highest_max = max(highest_max, __shfl_xor_sync(0xffffffffu, highest_max, offset));
  }
  if (lane == 0 && highest_max >= 0) {
    atomicMin(&range_first, lowest_min);
    atomicMax(&range_last, highest_max);
  }
  __syncthreads();
  const int32_t first_key = range_first, last_key = range_last;

  float acc[kMTiles][kDim / 8][4], score[kMTiles][kKeys / 8][4];
  float running_max[kMTiles][2], running_sum[kMTiles][2];
  bool poisoned[kMTiles][2];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      running_max[i][h] = -INFINITY;
      running_sum[i][h] = 0.0f;
      poisoned[i][h] = false;
    }
#pragma unroll
    for (int j = 0; j < kDim / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  }
  const float scale_log2 = scale * kLog2e;

  const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(pool.k);
  const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(pool.v);
  const KeyRows key_rows_of_sequence = key_rows(pool, batch, sequence, slot, kv_head);
  // The pool blocks of this thread's chunks of the tile of keys [tile_start, tile_start + kKeys) (-1 for none, and
  // past last_key), read from the block table before the MMAs that hide their latency.
  using Blocks = int32_t[kLoadsPerThread];
  auto locate = [&](int32_t tile_start, Blocks& blocks) {
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int32_t t = tile_start + (threadIdx.x + kThreads * i) / kChunks;
      blocks[i] = t <= last_key ? key_rows_of_sequence.block_of(t) : -1;
    }
  };
  // Starts copying that tile into `stage`; whether this thread met a key <= last_key whose block is missing (such
  // keys, and those past last_key, are zeros in the tile).
  auto fetch = [&](int32_t tile_start, int stage, const Blocks& blocks) {
    const uint32_t k_tile = shared_address(stages + stage * kStageBytes), v_tile = k_tile + kKeys * kRowBytes;
    bool missing = false;
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int chunk = threadIdx.x + kThreads * i;
      const int key = chunk / kChunks, part = chunk % kChunks;
      const int32_t t = tile_start + key, block = blocks[i];
      const bool absent = t <= last_key && block < 0;
      const int64_t offset = block >= 0 ? key_rows_of_sequence.offset(block, t) + part * 8 : 0;
      copy_async16(k_tile + swizzled(key, part), k_pool + offset, block >= 0);
      copy_async16(v_tile + swizzled(key, part), v_pool + offset, block >= 0);
      if (part == 0) key_missing[stage][key] = absent;
      missing |= absent;
    }
    return missing;
  };

  const int32_t tiles = first_key <= last_key ? (last_key - first_key) / kKeys + 1 : 0;
  // Bit s: this thread met a missing block in the tile fetched into stage s. Every iteration commits one group of
  // copies (empty past the last tile), so "all but the newest kStages - 2 groups" is always the tile in use.
  uint32_t fetched_missing = 0;
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < tiles) {
      Blocks blocks;
      locate(first_key + stage * kKeys, blocks);
      if (fetch(first_key + stage * kKeys, stage, blocks)) fetched_missing |= 1u << stage;
    }
    commit_copies();
  }
  const uint32_t q_tile = shared_address(shared);
  for (int32_t tile = 0; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    const int32_t tile_start = first_key + tile * kKeys, tile_end = tile_start + kKeys - 1;
    wait_copies<kStages - 2>();
    // The tile has landed for every thread, and every warp is done with the previous one, whose stage the next
    // fetch overwrites.
    const bool tile_missing = __syncthreads_or((fetched_missing >> stage) & 1u);
    const int refill = (tile + kStages - 1) % kStages;
    const int32_t refill_start = tile_start + (kStages - 1) * kKeys;
    const bool refilling = tile + kStages - 1 < tiles;
    fetched_missing &= ~(1u << refill);
    Blocks blocks;
    if (refilling) locate(refill_start, blocks);
    const bool seen = tile_end >= lowest_min && tile_start <= highest_max;  // by some vector of this warp
    const uint32_t k_tile = shared_address(stages + stage * kStageBytes), v_tile = k_tile + kKeys * kRowBytes;

#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) score[i][j][e] = 0.0f;
    if (seen) {
#pragma unroll
      for (int step = 0; step < kDim / 16; ++step) {
        uint32_t query[kQueryParts][kMTiles][4];
#pragma unroll
        for (int part = 0; part < kQueryParts; ++part)
#pragma unroll
          for (int i = 0; i < kMTiles; ++i)
            load_matrices(query[part][i], q_tile + part * kVectors * kRowBytes +
                                              swizzled(warp_first_vector + 16 * i + lane % 16, 2 * step + lane / 16));
#pragma unroll
        for (int pair = 0; pair < kKeys / 16; ++pair) {
          uint32_t key[4];
          load_matrices(key, k_tile + swizzled(16 * pair + lane % 8 + lane / 16 * 8, 2 * step + lane / 8 % 2));
#pragma unroll
          for (int i = 0; i < kMTiles; ++i)
#pragma unroll
            for (int part = kQueryParts - 1; part >= 0; --part) {  // the smallest term first
              mma(score[i][2 * pair], query[part][i], key[0], key[1]);
              mma(score[i][2 * pair + 1], query[part][i], key[2], key[3]);
            }
        }
      }
    }
    if (refilling && fetch(refill_start, refill, blocks)) fetched_missing |= 1u << refill;
    commit_copies();
    if (!seen) continue;

    if (tile_missing || tile_start < lowest_max || tile_end > highest_min) {
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e / 2, key = 8 * j + 2 * (lane % 4) + e % 2;
            const int32_t t = tile_start + key;
            const bool visible = t >= lowest[i][h] && t <= highest[i][h];
            if (tile_missing) poisoned[i][h] |= visible && key_missing[stage][key] != 0;
            if (!visible) score[i][j][e] = -INFINITY;
          }
    }

    // Online softmax per vector; the 4 lanes of a quad hold one vector's keys.
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
          tile_max = fmaxf(tile_max, fmaxf(score[i][j][2 * h], score[i][j][2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(running_max[i][h], tile_max);
        // While nothing is visible yet the maximum is -inf: subtract 0 instead (every exponent is -inf then).
        const float max_scaled = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
        const float correction = exp2f(running_max[i][h] * scale_log2 - max_scaled);
        running_max[i][h] = new_max;
        float tile_sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            score[i][j][e] = exp2f(fmaf(score[i][j][e], scale_log2, -max_scaled));
            tile_sum += score[i][j][e];
          }
        running_sum[i][h] = running_sum[i][h] * correction + tile_sum;
        if (__any_sync(0xffffffffu, correction != 1.0f)) {  // the maxima settle after a few tiles
#pragma unroll
          for (int j = 0; j < kDim / 8; ++j) {
            acc[i][j][2 * h] *= correction;
            acc[i][j][2 * h + 1] *= correction;
          }
        }
      }

    // O += P V, 16 keys per step: the S accumulators of two adjacent 8-key tiles are the A operand's layout.
#pragma unroll
    for (int step = 0; step < kKeys / 16; ++step) {
      uint32_t probability[kQueryParts][kMTiles][4];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const float(&left)[4] = score[i][2 * step];
        const float(&right)[4] = score[i][2 * step + 1];
        const float pairs[4][2] = {{left[0], left[1]}, {left[2], left[3]}, {right[0], right[1]}, {right[2], right[3]}};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          uint32_t terms[kQueryParts];
          split_pair(pairs[r][0], pairs[r][1], terms);
#pragma unroll
          for (int part = 0; part < kQueryParts; ++part) probability[part][i][r] = terms[part];
        }
      }
#pragma unroll
      for (int pair = 0; pair < kDim / 16; ++pair) {
        uint32_t value[4];
        load_matrices_transposed(value,
                                 v_tile + swizzled(16 * step + lane % 8 + lane / 8 % 2 * 8, 2 * pair + lane / 16));
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
#pragma unroll
          for (int part = kQueryParts - 1; part >= 0; --part) {
            mma(acc[i][2 * pair], probability[part][i], value[0], value[1]);
            mma(acc[i][2 * pair + 1], probability[part][i], value[2], value[3]);
          }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = running_sum[i][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      int poison = poisoned[i][h];
      poison |= __shfl_xor_sync(0xffffffffu, poison, 1);
      poison |= __shfl_xor_sync(0xffffffffu, poison, 2);
      running_sum[i][h] = sum;
      poisoned[i][h] = poison != 0;
    }
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int vector = warp_first_vector + 16 * i + 8 * h + lane / 4;
      if (vector >= vectors) continue;
      const int64_t row = first_row + vector / group;
      const int32_t head = kv_head * group + vector % group;
      const float inverse = running_sum[i][h] > 0.0f ? 1.0f / running_sum[i][h] : 0.0f;
      float* result = out + (row * num_heads + head) * kDim + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kDim / 8; ++j) {
        float2 value = make_float2(acc[i][j][2 * h] * inverse, acc[i][j][2 * h + 1] * inverse);
        if (poisoned[i][h]) value = make_float2(quiet_nan(), quiet_nan());
        *reinterpret_cast<float2*>(result + 8 * j) = value;
      }
    }
}

}  // namespace

int32_t prefill_mma_rows_per_tile(int32_t group) { return kVectors / group; }

cudaError_t launch_prefill_attention_mma(const float* q, const PoolGeometry& pool, int32_t slot,
                                         const BatchGeometry& batch, const int32_t* tile_list, int64_t tiles,
                                         int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                         cudaStream_t stream) {
  if (pool.dtype != DType::BF16) return cudaErrorInvalidValue;
  // All of the multiprocessor's L1 as shared memory (K/V copies bypass L1 anyway).
  static const cudaError_t configured = [] {
    const cudaError_t status = cudaFuncSetAttribute(
        prefill_attention_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedBytes));
    if (status != cudaSuccess) return status;
    return cudaFuncSetAttribute(prefill_attention_mma_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  }();
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned int>(tiles), static_cast<unsigned int>(pool.num_kv_heads));
  prefill_attention_mma_kernel<<<grid, kThreads, kSharedBytes, stream>>>(q, pool, slot, batch, tile_list, num_heads,
                                                                         scale, sliding_window, out);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
