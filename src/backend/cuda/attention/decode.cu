// Split-KV ("flash-decoding") paged attention for rows with few query rows per sequence. A block serves one row,
// one kv head and one of `splits` key ranges, reading each key and value of its range once for all the query
// heads of the group (GQA); a second kernel combines the splits with log-sum-exp weights, launched as a
// programmatic dependent so that its launch overlaps the first. The first kernel depends on the pool's dtype:
// - BF16 (the served dtype): QK and PV on the tensor cores (decode_attention_mma_kernel, described there).
// - E4M3 (--kv-cache-dtype fp8, the codes read back exactly): the same kernel on F16 operands, k_scale folded into
//   q's scale and v_scale into the output.
// - F32: F32 math on the CUDA cores. Each key is
//   spread over kLanesPerKey lanes (a "key slot") with several keys in flight; a slot keeps its own online softmax
//   (running max and sum) and the block combines its slots in shared memory. The score sums are reduce-scattered over the slot's lanes and shared back through shared
//   memory, so shuffles and exponentials are not repeated on every lane.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <type_traits>

#include "backend/cuda/common/async_copy.cuh"
#include "backend/cuda/common/kernel_variant.h"
#include "backend/cuda/common/mbarrier.cuh"
#include "backend/cuda/common/mma_f16.cuh"
#include "backend/cuda/attention/attention_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kKeysInFlight = 4;  // keys per key slot loaded before the first is used
constexpr int kMergeThreads = 128;

// What a lane loads per key: 16 bytes of an F32 pool (4 values).
template <typename P>
struct DecodeShape {
  using Raw = uint4;
  static constexpr int kValuesPerLoad = static_cast<int>(sizeof(Raw) / sizeof(P));
  static constexpr int kLanesPerKey = kFastHeadDim / kValuesPerLoad;
  static constexpr int kKeySlots = kDecodeThreads / kLanesPerKey;
  static constexpr int kKeysPerStep = kKeySlots * kKeysInFlight;
};

// Complete sums each lane holds after reduce_scatter of `count` values over lanes `offset`, `offset / 2`, ... 1.
constexpr int owned_sums(int count, int offset) {
  return offset == 0 ? count : count % 2 == 0 ? owned_sums(count / 2, offset / 2) : owned_sums(count, offset / 2);
}

// Sums v[0, kCount) over the lanes that differ in bits kOffset, kOffset / 2, ... 1, leaving each lane a share:
// while the count is even, each level keeps one half (by the lane's bit) and adds the partner's copy of it (one
// shuffle per kept value instead of one per value and level); an odd count finishes with full butterflies.
// On return v[0, owned_sums(kCount, kOffset)) hold the complete sums of values base, base + 1, ...
template <int kCount, int kOffset, int kSize>
__device__ __forceinline__ void reduce_scatter(float (&v)[kSize], int lane, int& base) {
  if constexpr (kOffset > 0) {
    if constexpr (kCount % 2 == 0) {
      constexpr int kHalf = kCount / 2;
      const bool upper = (lane & kOffset) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float keep = upper ? v[i + kHalf] : v[i];
        const float send = upper ? v[i] : v[i + kHalf];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
      }
      if (upper) base += kHalf;
      reduce_scatter<kHalf, kOffset / 2>(v, lane, base);
    } else {
#pragma unroll
      for (int i = 0; i < kCount; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], kOffset);
      reduce_scatter<kCount, kOffset / 2>(v, lane, base);
    }
  }
}

// Partials of split s of (decode row x, head h): acc [x][h][s][dim], then max and sum [x][h][s][2].
__host__ __device__ inline int64_t stats_offset(int64_t count, int32_t num_heads, int32_t splits) {
  return count * num_heads * splits * kFastHeadDim;
}

template <typename P, int kGroup>
__global__ void __launch_bounds__(kDecodeThreads) decode_attention_kernel(
    const float* q, PoolGeometry pool, int32_t slot, BatchGeometry batch, const int32_t* rows, int64_t count,
    int32_t splits, float* partials, int32_t num_heads, float scale, int32_t sliding_window, float* out) {
  using Shape = DecodeShape<P>;
  constexpr int kVec = Shape::kValuesPerLoad, kLanes = Shape::kLanesPerKey, kSlots = Shape::kKeySlots;
  __shared__ float slot_max[kSlots][kGroup], slot_sum[kSlots][kGroup];
  __shared__ float slot_acc[kSlots][kGroup][kFastHeadDim];
  // Per step, each key slot's (key, head) scores, probabilities and running maxima, shared among its lanes.
  constexpr int kScores = kKeysInFlight * kGroup;
  constexpr int kOwned = owned_sums(kScores, kLanes / 2);
  static_assert(kScores % 4 == 0, "scores are read back as float4");
  __shared__ __align__(16) float step_score[kSlots][kScores];
  __shared__ __align__(16) float step_probability[kSlots][kScores];
  __shared__ float step_max[kSlots][kGroup];

  const int64_t item = blockIdx.x;
  const int64_t row = rows != nullptr ? rows[item] : item;
  const int32_t kv_head = blockIdx.y, split = blockIdx.z;
  const int32_t group = num_heads / pool.num_kv_heads;
  const int key_slot = threadIdx.x / kLanes, part = threadIdx.x % kLanes, lane = threadIdx.x % 32;
  const int32_t sequence = batch.row_sequence[row];
  const int64_t position = batch.positions[row];
  const int64_t first = sliding_window > 0 ? max(int64_t{0}, position - sliding_window + 1) : 0;
  const int64_t last = min(position, int64_t{batch.seq_lens[sequence]} - 1);
  const int64_t keys = max(int64_t{0}, last - first + 1);
  const int64_t per_split = (keys + splits - 1) / splits;
  const int64_t split_keys = (per_split + Shape::kKeysPerStep - 1) / Shape::kKeysPerStep * Shape::kKeysPerStep;
  const int64_t begin = first + split * split_keys;
  const int64_t end = min(last, begin + split_keys - 1);

  float query[kGroup][kVec];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    const float* source = q + (row * num_heads + int64_t{kv_head} * group + h) * kFastHeadDim + part * kVec;
#pragma unroll
    for (int j = 0; j < kVec; j += 4) {
      float4 value{0.0f, 0.0f, 0.0f, 0.0f};
      if (h < group) value = *reinterpret_cast<const float4*>(source + j);
      query[h][j] = value.x;
      query[h][j + 1] = value.y;
      query[h][j + 2] = value.z;
      query[h][j + 3] = value.w;
    }
  }

  float running_max[kGroup], running_sum[kGroup], acc[kGroup][kVec];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    running_max[h] = -INFINITY;
    running_sum[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[h][j] = 0.0f;
  }
  bool missing = false;
  const P* k_pool = static_cast<const P*>(pool.k);
  const P* v_pool = static_cast<const P*>(pool.v);
  const KeyRows key_rows_of_sequence = key_rows(pool, batch, sequence, slot, kv_head);
  const int32_t last_key = static_cast<int32_t>(end);

  // Block-table entries run three steps ahead of the K/V loads, and the keys two steps ahead are prefetched to
  // L2 (one lane per 128-byte line of each row): more bytes in flight than the registers hold, and no wait on
  // the table before a step's loads. kPastEnd marks keys beyond this split's range.
  constexpr int32_t kPastEnd = -2;
  auto table_entries = [&](int32_t step, int32_t (&blocks)[kKeysInFlight]) {
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      const int32_t t = step + c * kSlots + key_slot;
      blocks[c] = t <= last_key ? key_rows_of_sequence.block_of(t) : kPastEnd;
    }
  };
  const bool prefetcher = (part * kVec * static_cast<int>(sizeof(P))) % 128 == 0;
  auto prefetch = [&](int32_t step, const int32_t (&blocks)[kKeysInFlight]) {
    if (!prefetcher) return;
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      if (blocks[c] < 0) continue;
      const int64_t offset = key_rows_of_sequence.offset(blocks[c], step + c * kSlots + key_slot) + part * kVec;
      prefetch_l2(k_pool + offset);
      prefetch_l2(v_pool + offset);
    }
  };
  constexpr int32_t kStep = Shape::kKeysPerStep;
  const int32_t first_step = static_cast<int32_t>(begin);
  int32_t blocks_now[kKeysInFlight], blocks_next[kKeysInFlight], blocks_ahead[kKeysInFlight];
  table_entries(first_step, blocks_now);
  table_entries(first_step + kStep, blocks_next);
  table_entries(first_step + 2 * kStep, blocks_ahead);
  prefetch(first_step + kStep, blocks_next);

  for (int32_t step = first_step; step <= last_key; step += kStep) {
    typename Shape::Raw k_raw[kKeysInFlight], v_raw[kKeysInFlight];
    unsigned int valid = 0;  // bit c: key c of this step is visible and present
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      k_raw[c] = v_raw[c] = typename Shape::Raw{};
      missing |= blocks_now[c] == -1;
      if (blocks_now[c] >= 0) {
        valid |= 1u << c;
        const int64_t offset = key_rows_of_sequence.offset(blocks_now[c], step + c * kSlots + key_slot) + part * kVec;
        k_raw[c] = load_stream(k_pool + offset);
        v_raw[c] = load_stream(v_pool + offset);
      }
    }
    prefetch(step + 2 * kStep, blocks_ahead);
    int32_t blocks_later[kKeysInFlight];
    table_entries(step + 3 * kStep, blocks_later);

    // Partial dots of this lane's dims, summed over the key slot's lanes by reduce_scatter: each lane ends with
    // kOwned complete scores, and exponentiates only those.
    float partial[kScores];
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      float key[kVec];
      unpack(k_raw[c], key);
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot = fmaf(query[h][j], key[j], dot);
        partial[c * kGroup + h] = dot;
      }
    }
    int base = 0;
    reduce_scatter<kScores, kLanes / 2>(partial, lane, base);
    float owned[kOwned];
#pragma unroll
    for (int j = 0; j < kOwned; ++j) {
      const int c = (base + j) / kGroup;
      owned[j] = (valid >> c) & 1u ? scale * partial[j] : -INFINITY;
      step_score[key_slot][base + j] = owned[j];
    }
    __syncwarp();
    float score[kScores];
#pragma unroll
    for (int i = 0; i < kScores; i += 4) {
      const float4 four = *reinterpret_cast<const float4*>(&step_score[key_slot][i]);
      score[i] = four.x;
      score[i + 1] = four.y;
      score[i + 2] = four.z;
      score[i + 3] = four.w;
    }
    bool grew = false;
    float new_max[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      new_max[h] = running_max[h];
#pragma unroll
      for (int c = 0; c < kKeysInFlight; ++c) new_max[h] = fmaxf(new_max[h], score[c * kGroup + h]);
      grew |= new_max[h] > running_max[h];
    }
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const float correction = new_max[h] == running_max[h] ? 1.0f : expf(running_max[h] - new_max[h]);
        running_sum[h] *= correction;
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[h][j] *= correction;
        running_max[h] = new_max[h];
      }
    }
    if (part == 0) {
#pragma unroll
      for (int h = 0; h < kGroup; ++h) step_max[key_slot][h] = running_max[h];
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kOwned; ++j) {
      const int h = (base + j) % kGroup;
      step_probability[key_slot][base + j] =
          owned[j] == -INFINITY ? 0.0f : expf(owned[j] - step_max[key_slot][h]);
    }
    __syncwarp();
    float probability[kScores];
#pragma unroll
    for (int i = 0; i < kScores; i += 4) {
      const float4 four = *reinterpret_cast<const float4*>(&step_probability[key_slot][i]);
      probability[i] = four.x;
      probability[i + 1] = four.y;
      probability[i + 2] = four.z;
      probability[i + 3] = four.w;
    }
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      float value[kVec];
      unpack(v_raw[c], value);
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const float p = probability[c * kGroup + h];
        running_sum[h] += p;
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[h][j] = fmaf(p, value[j], acc[h][j]);
      }
    }
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      blocks_now[c] = blocks_next[c];
      blocks_next[c] = blocks_ahead[c];
      blocks_ahead[c] = blocks_later[c];
    }
  }

  if (part == 0) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      slot_max[key_slot][h] = running_max[h];
      slot_sum[key_slot][h] = running_sum[h];
    }
  }
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
#pragma unroll
    for (int j = 0; j < kVec; ++j) slot_acc[key_slot][h][part * kVec + j] = acc[h][j];
  const bool poisoned = __syncthreads_or(missing) != 0;

  for (int index = threadIdx.x; index < group * kFastHeadDim; index += kDecodeThreads) {
    const int h = index / kFastHeadDim, d = index % kFastHeadDim;
    float block_max = -INFINITY;
    for (int s = 0; s < kSlots; ++s) block_max = fmaxf(block_max, slot_max[s][h]);
    float sum = 0.0f, value = 0.0f;
    if (block_max != -INFINITY) {
      for (int s = 0; s < kSlots; ++s) {
        const float weight = slot_max[s][h] == -INFINITY ? 0.0f : expf(slot_max[s][h] - block_max);
        sum += weight * slot_sum[s][h];
        value += weight * slot_acc[s][h][d];
      }
    }
    const int32_t head = kv_head * group + h;
    if (splits == 1) {
      out[(row * num_heads + head) * kFastHeadDim + d] = poisoned ? quiet_nan() : (sum > 0.0f ? value / sum : 0.0f);
    } else {
      const int64_t index_of_split = (item * num_heads + head) * splits + split;
      partials[index_of_split * kFastHeadDim + d] = value;
      if (d == 0) {
        float* stats = partials + stats_offset(count, num_heads, splits);
        stats[2 * index_of_split] = block_max;
        stats[2 * index_of_split + 1] = poisoned ? quiet_nan() : sum;
      }
    }
  }
}

// ---- BF16 and E4M3 pools: the tensor-core kernel ----
// Per warp and 16-key tile, S^T = K · Q^T and O^T += V^T · P^T on mma.m16n8k16: the tile's keys (then the head's
// dims) are the MMA's M, the group's query heads its N (8, heads past the group computed on zeros and never
// stored), so each K and V element read from the pool serves every head of the group. q (F32, pre-scaled by
// scale · log2 e) and P enter as hi + lo operands accumulated in F32, so scores and outputs keep F32 accuracy; K
// and V enter exactly. Memory-bound: the second MMA of each pair costs no time.
//  - BF16 pools: BF16 operands, K and V tiles read by ldmatrix as copied.
//  - E4M3 pools (--kv-cache-dtype fp8): F16 operands (E4M3 is a subset of F16; q scaled by a power of two into
//    F16's range, P by 2^14). The tiles are copied raw (half the bytes; more blocks per multiprocessor), K decoded in
//    registers straight from the raw tile (lane (g, c) takes 16 codes of keys g and g + 8 per 64 dims; as the
//    operand layout lets any dims pair up when q's fragments follow, its word j feeds k-step 4 h + j, codes 0 and
//    2 as dims 2c, 2c + 1, codes 1 and 3 as 2c + 8, 2c + 9), V decoded into one F16 tile per warp that ldmatrix
//    reads transposed, as for BF16.
// Each warp streams its own tiles (warp w takes tiles w, w + kMmaWarps, ... of the block's range) through a
// cp.async pipeline of kStages tiles in shared memory, so the key loop has no block-wide barrier; the warps'
// softmax states are combined at the end. Tiles are aligned to multiples of 16 positions (keys outside the
// visible range are zero-filled, never read, and masked), so with blocks of >= 16 positions a tile is one block.
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kTileKeys = 16;                         // the MMA's M
constexpr int kMmaHeads = 8;                          // the MMA's N: query heads per kv head, padded
constexpr int kDimSteps = kFastHeadDim / 16;          // MMA k-steps over head_dim for QK, m-tiles for PV
constexpr int kRowBytes = kFastHeadDim * 2;           // one 16-bit key or value row, as ldmatrix reads it
constexpr int kTileBytes = kTileKeys * kRowBytes;     // 4 KiB of K, as much of V
constexpr float kLog2E = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kProbabilityScale = 16384.0f;  // E4M3 pools: P * 2^14 keeps the F16 split's low part normal

// Per pool dtype: the tiles per warp in flight or in use, the bytes of one copied row, the F16 V tile per warp that
// E4M3 pools decode into (the PerRow version; the others decode V in registers and use its space as a fourth
// stage), and the blocks per multiprocessor the shared memory allows. E4M3 tiles take more instructions per byte
// (decoding) with dependent steps, so their kernel wants more warps per multiprocessor rather than more tiles in
// flight per warp: three blocks (12 warps) of 3 stages measured faster than two blocks of 6.
template <typename Pool>
struct MmaPool;
template <>
struct MmaPool<__nv_bfloat16> {
  static constexpr int kStages = 3, kCopiedRowBytes = kFastHeadDim * 2, kStagingBytes = 0, kBlocksPerSm = 2;
};
template <>
struct MmaPool<E4m3> {
  static constexpr int kStages = 3, kCopiedRowBytes = kFastHeadDim, kStagingBytes = kTileBytes, kBlocksPerSm = 3;
};
template <typename Pool>
constexpr int kStageBytes = 2 * kTileKeys * MmaPool<Pool>::kCopiedRowBytes;  // K then V
template <typename Pool>
constexpr int kWarpBytes = MmaPool<Pool>::kStages * kStageBytes<Pool> + MmaPool<Pool>::kStagingBytes;
// A block's shared memory: kMmaWarps warps of kWarpBytes (96 KiB BF16, 64 KiB E4M3; DecodeLayout checks that the
// blocks per multiprocessor fit, for every version).
// The warps' O in shared memory at the end, [warp][head][dim]: rows of kWarpAccStride floats and dims skewed by one
// bank per 32, so that a warp's stores of one register (every kernel version's layout) spread over the banks.
constexpr int kWarpAccStride = kFastHeadDim + 4;
__device__ __forceinline__ int warp_acc_index(int warp, int head, int dim) {
  return (warp * kMmaHeads + head) * kWarpAccStride + dim + dim / 32;
}

// Byte offset of 16-byte chunk `chunk` of staged row `row`: chunks are XOR-swizzled by the row so that the eight
// rows one ldmatrix reads at the same chunk fall in different banks.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * kRowBytes + ((chunk ^ (row & 7)) << 4); }
// The same for a copied row of either pool: BF16 rows as above; E4M3 rows of 8 chunks, the odd rows' halves swapped so
// that the 16-byte K loads of keys g and g + 1 (one phase of a warp's shared load) fall in different banks.
template <typename Pool>
__device__ __forceinline__ int copied(int row, int chunk) {
  if constexpr (sizeof(Pool) == 1)
    return row * kFastHeadDim + ((chunk ^ ((row & 1) << 2)) << 4);
  else
    return swizzled(row, chunk);
}

// E4M3 V rows when the kernel decodes V in registers (per-tile versions): lane (g, c) reads chunk g of rows 2c, 2c + 1,
// 2c + 8 and 2c + 9, so rows 2c of c = 0..3, read with chunks g = 0 and 1 in one phase of a 16-byte shared load, must
// fall in different banks: chunks XOR-ed with 2 ((row / 2) % 4).
template <typename Pool, bool kValueRegisters>
__device__ __forceinline__ int copied_value(int row, int chunk) {
  if constexpr (kValueRegisters)
    return row * kFastHeadDim + ((chunk ^ (((row >> 1) & 3) << 1)) << 4);
  else
    return copied<Pool>(row, chunk);
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// The A fragment of V^T's m-tile i (E4M3 pools, V in registers) from this lane's raw rows: keys 2c, 2c + 1, 2c + 8,
// 2c + 9 (rows[0..3]) at dims 16 g .. 16 g + 15. The m-tile's rows g and g + 8 are dims 16 g + 2 i and 16 g + 2 i + 1
// (any assignment of dims to rows works when the output follows it), so a[0] pairs keys 2c and 2c + 1 at byte 2 i of
// their chunks, a[1] the same at byte 2 i + 1, a[2] and a[3] keys 2c + 8 and 2c + 9: one byte permutation per two
// registers, then the conversions.
__device__ __forceinline__ void value_fragment(const uint4 (&rows)[4], int i, uint32_t (&a)[4]) {
  const int w = i >> 1;
  const uint32_t selector = (i & 1) != 0 ? 0x7362u : 0x5140u;  // bytes (2, 6, 3, 7) or (0, 4, 1, 5)
  const uint32_t low = __byte_perm(word_of(rows[0], w), word_of(rows[1], w), selector);
  const uint32_t high = __byte_perm(word_of(rows[2], w), word_of(rows[3], w), selector);
  a[0] = e4m3x2_to_half2(low);
  a[1] = e4m3x2_to_half2(low >> 16);
  a[2] = e4m3x2_to_half2(high);
  a[3] = e4m3x2_to_half2(high >> 16);
}

// value_fragment's registers by bit operations (e4m3x4_to_half2: integer instructions and an F16 multiplication)
// instead of cvt: the bytes paired as (key 2c at dim d, at d + 1, key 2c + 1 at d, at d + 1), so that the word's
// codes (0, 2) are the pair at dim d and (1, 3) the pair at d + 1.
__device__ __forceinline__ void value_fragment_bits(const uint4 (&rows)[4], int i, uint32_t (&a)[4]) {
  const int w = i >> 1;
  const uint32_t selector = (i & 1) != 0 ? 0x7632u : 0x5410u;  // bytes (2, 3, 6, 7) or (0, 1, 4, 5)
  e4m3x4_to_half2(__byte_perm(word_of(rows[0], w), word_of(rows[1], w), selector), a[0], a[1]);
  e4m3x4_to_half2(__byte_perm(word_of(rows[2], w), word_of(rows[3], w), selector), a[2], a[3]);
}

// Four 8x8 BF16 matrices, lane l giving the address of row l % 8 of matrix l / 8: each lane gets row lane / 4,
// columns (lane % 4) * 2 and + 1 of every matrix (the MMA's A fragment), or with `.trans` the same of every
// matrix transposed.
__device__ __forceinline__ void load_matrices(uint32_t (&a)[4], const void* address) {
  const auto shared = static_cast<unsigned>(__cvta_generic_to_shared(address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(shared));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&a)[4], const void* address) {
  const auto shared = static_cast<unsigned>(__cvta_generic_to_shared(address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(shared));
}

// An 8x8 BF16 matrix held as the C fragment's pairs (lane l: row l / 4, columns (l % 4) * 2, + 1) transposed in
// registers: the same lane then holds row l / 4 of the transpose, which is the B fragment's layout.
__device__ __forceinline__ uint32_t transpose(uint32_t pair) {
  uint32_t result;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(result) : "r"(pair));
  return result;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (x, y) as BF16 pairs hi = bf16(x, y) and lo = bf16(x - hi.x, y - hi.y), x in the low half (the lower k index).
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 high = __floats2bfloat162_rn(x, y);
  const float2 rounded = __bfloat1622float2(high);
  const __nv_bfloat162 low = __floats2bfloat162_rn(x - rounded.x, y - rounded.y);
  hi = *reinterpret_cast<const uint32_t*>(&high);
  lo = *reinterpret_cast<const uint32_t*>(&low);
}

// Lets the merge kernel (launched as a programmatic dependent) start its blocks while this grid runs; it waits
// for this grid's results in griddepcontrol.wait.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
// Waits until the grids this one is a programmatic dependent of are complete and their writes visible (at once when it
// was launched plainly).
__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// The kernel's versions (BEAMLINE_CUDA_DECODE_ATTENTION: unset QueryRows over E4M3 pools and PerTile over BF16 ones,
// `per-tile` PerTile, `legacy` PerRow, `keys-cvt` PerTileKeysCvt, `query-rows-keys-bits`, `query-rows-values-bits`,
// `query-rows-bulk`, `query-rows-2-blocks`, `query-rows-pdl`, `query-rows-pairs`):
//  - PerRow (the first kernel): every lane looks its four rows up in the block table, one after another, each
//    lookup a dependent global load, and computes each row's 64-bit source and swizzled target: ~150 integer
//    instructions per tile. On E4M3 pools a tile is 4 KiB, so that and the decoding made the kernel issue-bound
//    (bench/results/2026-12-03-fp8dec.md counts them).
//  - PerTile: a tile of 16 positions lies in one pool block when blocks hold >= 16 positions, so one table entry,
//    looked up a tile ahead, gives one 64-bit base; every lane's source offsets and swizzled targets within a tile
//    are loop constants in registers. Tiles cut by the visible range, and blocks of < 16 positions, take the
//    per-row path. E4M3 pools also decode V in registers (value_fragment).
//  - PerTileKeysCvt (E4M3 pools): as PerTile, with K decoded by cvt (two codes per instruction, on the conversion
//    unit) instead of e4m3x4_to_half2's bit operations (~7 integer instructions, issued at half rate, per four
//    codes), q's fragments following the pairs cvt makes: which of the integer and the conversion pipes binds is for
//    the GPU to say.
//  - QueryRows (E4M3 pools): as PerTileKeysCvt, with the operands' roles swapped: S = Q K^T and O = P V, q's hi and
//    lo parts as rows g and g + 8 of one A operand (one MMA makes both products), K and V as B operands decoded from
//    the same shared loads. The scores then come out in the layout P's A operand takes (lane (g, c): head g, keys
//    2c, 2c + 1, 2c + 8, 2c + 9), so P needs no movmatrix, and a head's keys sit in 4 lanes: the tile's max takes 2
//    shuffles instead of 6 (bench/results/2026-12-03-fp8kv.md). O's hi and lo rows are summed at the end (64
//    accumulators a lane instead of 32). Which pipe the 64 conversions a tile load most is for the GPU to say, so
//    two more versions move half of them to integer instructions: QueryRowsKeysBits decodes K by e4m3x4_to_half2
//    (q paired to match, as PerTile), QueryRowsValuesBits V by value_fragment_bits.
//  - QueryRowsBulk (E4M3 pools): QueryRows with each 128-byte K or V row of a tile copied by one bulk copy (lane l:
//    K row l, lane 16 + l: V row l; one instruction a lane and tile instead of 8 cp.async and their addresses),
//    completing on the stage's mbarrier. A bulk copy cannot swizzle within a row, so rows lie kBulkRowBytes apart
//    (bank-conflict-free for the V loads as they are and for the K loads when lane c takes chunks 2c and 2c + 1,
//    q's dims following). Rows outside the visible range or in a missing block are zeroed by ordinary stores.
//  - QueryRowsTwoBlocks (E4M3 pools): QueryRows with fewer warps per multiprocessor and more stages each
//    (DecodeLayout), for the GPU to rank (bench/gpu_tune14.sh).
//  - QueryRowsEarly (`query-rows-pdl`, E4M3 pools): QueryRows launched as a programmatic dependent of the kernel before
//    it, whose merge lets the next such launch start too: a block looks its first tiles up in the block table and
//    copies them while the kernel before drains (at B=1 every call pays ~12 us beside its bytes, bench/results/
//    2026-12-03-tune14.md), and waits for it (griddepcontrol.wait) before it reads q or a key this step may have
//    written: a decode row's sequence wrote at most kDecodeMaxQueryRows positions this step, the last being the row's.
//  - QueryRowsPairs (E4M3 pools): QueryRowsTwoBlocks taking two tiles a step (query_rows_step): one max over the head's
//    lanes, one rescaling test, one select for both, ~15 instructions fewer a tile of ~250.
enum class DecodeVersion {
  PerRow,
  PerTile,
  PerTileKeysCvt,
  QueryRows,
  QueryRowsKeysBits,
  QueryRowsValuesBits,
  QueryRowsBulk,
  QueryRowsTwoBlocks,
  QueryRowsEarly,
  QueryRowsPairs
};

constexpr bool query_rows(DecodeVersion version) {
  return version == DecodeVersion::QueryRows || version == DecodeVersion::QueryRowsKeysBits ||
         version == DecodeVersion::QueryRowsValuesBits || version == DecodeVersion::QueryRowsBulk ||
         version == DecodeVersion::QueryRowsTwoBlocks || version == DecodeVersion::QueryRowsEarly ||
         version == DecodeVersion::QueryRowsPairs;
}

// QueryRowsBulk's shared memory: per warp kBulkStages stages of 16 K rows then 16 V rows, kBulkRowBytes apart (a
// 128-byte row and 16 bytes of padding), then the warps' stage barriers.
constexpr int kBulkRowBytes = kFastHeadDim + 16;
constexpr int kBulkTileBytes = kTileKeys * kBulkRowBytes;
constexpr int kBulkStageBytes = 2 * kBulkTileBytes;
constexpr int kBulkStages = MmaPool<E4m3>::kStages + 1;  // as many as the other per-tile versions of E4M3 pools
constexpr int kBulkSharedBytes = kMmaWarps * kBulkStages * (kBulkStageBytes + static_cast<int>(sizeof(uint64_t)));
__device__ __forceinline__ int bulk_row(int row, int chunk) { return row * kBulkRowBytes + chunk * 16; }

// A version's shared memory and occupancy: the stages of a warp's ring, a stage's and a warp's bytes, the block's, and
// the blocks per multiprocessor (__launch_bounds__). QueryRowsTwoBlocks is QueryRows (E4M3 pools: 3 blocks of 4 warps,
// 3 of 4 stages a warp in flight, 144 KiB a multiprocessor) with 2 blocks of 7 stages, 6 in flight: 192 KiB a
// multiprocessor from 8 warps instead of 12. More warps are not to be had: QueryRows takes 147-157 registers, and 4
// blocks (128 registers a thread) spill.
template <typename Pool, DecodeVersion kVersion>
struct DecodeLayout {
  static constexpr bool kE4m3 = sizeof(Pool) == 1;
  static constexpr bool kBulk = kE4m3 && kVersion == DecodeVersion::QueryRowsBulk;
  // QueryRowsPairs takes QueryRowsTwoBlocks' layout: two tiles a step leave kStages - 2 in flight, and its registers
  // (a second tile's V rows and scores) exceed what three blocks allow.
  static constexpr bool kTwoBlocks =
      kE4m3 && (kVersion == DecodeVersion::QueryRowsTwoBlocks || kVersion == DecodeVersion::QueryRowsPairs);
  // E4M3 pools with per-tile copies decode V in registers: the F16 V tile's space holds one more stage.
  static constexpr bool kValueRegisters = kE4m3 && kVersion != DecodeVersion::PerRow;
  static constexpr int kBlocksPerSm = kTwoBlocks ? 2 : MmaPool<Pool>::kBlocksPerSm;
  static constexpr int kStages =
      kTwoBlocks ? 7
                 : MmaPool<Pool>::kStages + (kValueRegisters ? MmaPool<Pool>::kStagingBytes / kStageBytes<Pool> : 0);
  static constexpr int kStageStride = kBulk ? kBulkStageBytes : kStageBytes<Pool>;
  static constexpr int kWarpStride = kBulk        ? kBulkStages * kBulkStageBytes
                                     : kTwoBlocks ? kStages * kStageBytes<Pool>
                                                  : kWarpBytes<Pool>;
  static constexpr int kSharedBytes = kBulk ? kBulkSharedBytes : kMmaWarps * kWarpStride;
  static_assert(kBulk || kStages * kStageBytes<Pool> + (kValueRegisters ? 0 : MmaPool<Pool>::kStagingBytes) <=
                             kWarpStride,
                "the stages (and E4M3 PerRow's V tile) fit the warp's shared memory");
  static_assert(!kBulk || kStages == kBulkStages, "QueryRowsBulk's shared memory holds kBulkStages stages");
  static_assert(kBlocksPerSm * (kSharedBytes + 1024) <= 227 * 1024, "the blocks per multiprocessor fit");
  static_assert(kMmaWarps * (kMmaHeads * kWarpAccStride + 2 * kMmaHeads) * static_cast<int>(sizeof(float)) <=
                    kSharedBytes,
                "the warps' results are combined in the pipeline's shared memory");
};

// kTiles 16-key tiles of an E4M3 pool, QueryRows versions, for lane (g, c) = (fragment_row, fragment_pair) of the warp:
// k_tiles and v_tiles are the staged tiles (copied<E4m3>, copied_value<E4m3, true>; kBulkLayout: bulk_row), q_hi and
// q_lo q's split pairs of k-step 4 h + j (dims 16 x + 4 j + (0, 1) and + (2, 3) of the K chunk x = 4 h + c,
// kBulkLayout: 2 c + h; the pairs cvt makes of a K word; kKeysBits: + (0, 2) and + (1, 3), e4m3x4_to_half2's),
// tile_first each tile's first position and [first, last] the visible range. Updates the head's running max (base 2)
// and this lane's partial sum and its O fragments. The online softmax's update (the max over the head's 4 lanes, the
// rescaling test) is made once for the kTiles tiles (QueryRowsPairs: 2).
template <int kTiles, bool kKeysBits, bool kValuesBits, bool kBulkLayout>
__device__ __forceinline__ void query_rows_step(const unsigned char* const (&k_tiles)[kTiles],
                                                const unsigned char* const (&v_tiles)[kTiles],
                                                const uint32_t (&q_hi)[kDimSteps][2],
                                                const uint32_t (&q_lo)[kDimSteps][2], float q_unscale,
                                                const int32_t (&tile_first)[kTiles], int32_t first, int32_t last,
                                                float& running_max, float& partial_sum,
                                                float (&acc)[2 * kDimSteps][4]) {
  const int lane = threadIdx.x % 32, fragment_row = lane / 4, fragment_pair = lane % 4;
  uint4 value_rows[kTiles][4];  // keys 2c, 2c + 1, 2c + 8, 2c + 9 at dims 16 g .. 16 g + 15, raw
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int value_row = 2 * fragment_pair + (r & 1) + 8 * (r >> 1);
      const int offset =
          kBulkLayout ? bulk_row(value_row, fragment_row) : copied_value<E4m3, true>(value_row, fragment_row);
      value_rows[t][r] = *reinterpret_cast<const uint4*>(v_tiles[t] + offset);
    }
  // S = Q K^T per n-tile n of keys 8 n .. 8 n + 7: B's column g is key 8 n + g, its k-pairs the codes (0, 1) and
  // (2, 3) of the key's word j; C's [0], [1] are q_hi's products with keys 8 n + 2c, + 1, [2], [3] q_lo's. Even and
  // odd k-steps accumulate apart (products[n][s % 2]): four chains of 4 dependent MMAs instead of two of 8.
  // Scores of keys 2c, 2c + 1, 2c + 8, 2c + 9 of head g (masked only in a tile cut by the range: the warp's branch).
  float score[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    float products[2][2][4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int chunk = kBulkLayout ? 2 * fragment_pair + h : 4 * h + fragment_pair;
      const uint4 low = *reinterpret_cast<const uint4*>(
          k_tiles[t] + (kBulkLayout ? bulk_row(fragment_row, chunk) : copied<E4m3>(fragment_row, chunk)));
      const uint4 high = *reinterpret_cast<const uint4*>(
          k_tiles[t] + (kBulkLayout ? bulk_row(fragment_row + 8, chunk) : copied<E4m3>(fragment_row + 8, chunk)));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int s = 4 * h + j;
        const uint32_t a[4] = {q_hi[s][0], q_lo[s][0], q_hi[s][1], q_lo[s][1]};
        uint32_t b[2][2];  // n-tile n's B registers
        if constexpr (kKeysBits) {
          e4m3x4_to_half2(word_of(low, j), b[0][0], b[0][1]);
          e4m3x4_to_half2(word_of(high, j), b[1][0], b[1][1]);
        } else {
          b[0][0] = e4m3x2_to_half2(word_of(low, j));
          b[0][1] = e4m3x2_to_half2(word_of(low, j) >> 16);
          b[1][0] = e4m3x2_to_half2(word_of(high, j));
          b[1][1] = e4m3x2_to_half2(word_of(high, j) >> 16);
        }
        mma_f16(products[0][j % 2], a, b[0][0], b[0][1]);
        mma_f16(products[1][j % 2], a, b[1][0], b[1][1]);
      }
    }
    const bool interior = tile_first[t] >= first && tile_first[t] + kTileKeys - 1 <= last;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int32_t key = tile_first[t] + 8 * n + 2 * fragment_pair + e;
        const float hi = products[n][0][e] + products[n][1][e], lo = products[n][0][2 + e] + products[n][1][2 + e];
        score[t][2 * n + e] = interior || (key >= first && key <= last) ? (hi + lo) * q_unscale : -INFINITY;
      }
  }
  // The tiles' max over the 4 lanes of the head.
  float tile_max = -INFINITY;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
    tile_max = fmaxf(tile_max, fmaxf(fmaxf(score[t][0], score[t][1]), fmaxf(score[t][2], score[t][3])));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  if (__any_sync(0xffffffffu, tile_max > running_max)) {
    if (tile_max > running_max) {
      const float correction = exp2f(running_max - tile_max);  // 0 while the max was -inf
      partial_sum *= correction;
#pragma unroll
      for (int t = 0; t < 2 * kDimSteps; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[t][j] *= correction;
      running_max = tile_max;
    }
  }
  // Masked keys give exp2(-inf) = 0; while the max is still -inf (every key so far masked) 0 stands in for it, so that
  // -inf - -inf makes no NaN: one select a step instead of one a key.
  const float reference = running_max == -INFINITY ? 0.0f : running_max;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    float probability[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) probability[i] = exp2f(score[t][i] - reference);
    partial_sum += (probability[0] + probability[1]) + (probability[2] + probability[3]);
    // P's A fragment as the scores lie: rows g and g + 8 are P's hi and lo parts (times 2^14) at keys 2c, 2c + 1,
    // then at 2c + 8, 2c + 9.
    uint32_t p[4];
    split_half2(probability[0] * kProbabilityScale, probability[1] * kProbabilityScale, p[0], p[1]);
    split_half2(probability[2] * kProbabilityScale, probability[3] * kProbabilityScale, p[2], p[3]);
    // O += P V per n-tile i of 8 dims, column g being dim 16 g + i: value_fragment(i) gives, for dims 16 g + 2 i and
    // + 1, keys (2c, 2c + 1) in [0] and [1] and keys (2c + 8, 2c + 9) in [2] and [3].
#pragma unroll
    for (int i = 0; i < kDimSteps; ++i) {
      uint32_t v[4];
      if constexpr (kValuesBits)
        value_fragment_bits(value_rows[t], i, v);
      else
        value_fragment(value_rows[t], i, v);
      mma_f16(acc[2 * i], p, v[0], v[2]);
      mma_f16(acc[2 * i + 1], p, v[1], v[3]);
    }
  }
}

template <typename Pool, DecodeVersion kVersion>
__global__ void __launch_bounds__(kMmaThreads, DecodeLayout<Pool, kVersion>::kBlocksPerSm) decode_attention_mma_kernel(
    const float* q, PoolGeometry pool, int32_t slot, BatchGeometry batch, const int32_t* rows, int64_t count,
    int32_t splits, float* partials, int32_t num_heads, float scale, int32_t sliding_window, float* out) {
  using Layout = DecodeLayout<Pool, kVersion>;
  constexpr bool kE4m3 = Layout::kE4m3;
  constexpr bool kPerTileCopy = kVersion != DecodeVersion::PerRow;
  // E4M3 pools with per-tile copies also decode V in registers straight into the A fragments, instead of an F16 tile
  // in shared memory that ldmatrix reads back transposed (16 fewer shared-memory instructions a tile).
  constexpr bool kValueRegisters = Layout::kValueRegisters;
  constexpr bool kQueryRows = kE4m3 && query_rows(kVersion);
  constexpr bool kBulk = Layout::kBulk;
  constexpr bool kEarly = kE4m3 && kVersion == DecodeVersion::QueryRowsEarly;
  constexpr bool kPairs = kE4m3 && kVersion == DecodeVersion::QueryRowsPairs;
  constexpr bool kKeysCvt = kE4m3 && (kVersion == DecodeVersion::PerTileKeysCvt ||
                                      (kQueryRows && kVersion != DecodeVersion::QueryRowsKeysBits));
  // O's fragments: kDimSteps m-tiles of O^T, or (kQueryRows) 16 n-tiles of 8 dims of O, hi rows and lo rows.
  constexpr int kAccTiles = kQueryRows ? 2 * kDimSteps : kDimSteps;
  // The ring's stages; a stage's bytes and where its V rows start; a warp's bytes (kBulk: its barriers follow all
  // warps' stages).
  constexpr int kStages = Layout::kStages;
  constexpr int kStageStride = Layout::kStageStride;
  constexpr int kValueOffset = kBulk ? kBulkTileBytes : kStageBytes<Pool> / 2;
  constexpr int kWarpStride = Layout::kWarpStride;
  constexpr int kChunksPerLane = MmaPool<Pool>::kCopiedRowBytes / 128;  // per row copied: 8 lanes, 16 bytes each
  extern __shared__ __align__(128) unsigned char shared[];
  allow_dependent_launch();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int fragment_row = lane / 4, fragment_pair = lane % 4;  // the MMA fragments' row and column pair
  const int64_t item = blockIdx.x / pool.num_kv_heads;
  const int64_t row = rows != nullptr ? rows[item] : item;
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x % pool.num_kv_heads), split = blockIdx.y;
  const int32_t group = num_heads / pool.num_kv_heads;
  const int32_t sequence = batch.row_sequence[row];
  const int32_t position = batch.positions[row];
  const int32_t first = sliding_window > 0 ? max(0, position - sliding_window + 1) : 0;
  const int32_t last = min(position, batch.seq_lens[sequence] - 1);
  const int32_t first_tile = first / kTileKeys;
  const int32_t tiles = last >= first ? last / kTileKeys - first_tile + 1 : 0;
  const int32_t per_split = (tiles + splits - 1) / splits;
  const int32_t split_begin = first_tile + split * per_split;
  const int32_t split_end = min(first_tile + tiles, split_begin + per_split);
  const int32_t warp_tiles = max(0, (split_end - split_begin - warp + kMmaWarps - 1) / kMmaWarps);

  const auto* k_pool = static_cast<const Pool*>(pool.k);
  const auto* v_pool = static_cast<const Pool*>(pool.v);
  constexpr int kChunkElements = 16 / sizeof(Pool);
  const KeyRows key_rows_of_sequence = key_rows(pool, batch, sequence, slot, kv_head);
  unsigned char* stages = shared + warp * kWarpStride;
  unsigned char* staging = stages + kStages * kStageBytes<Pool>;  // E4M3 PerRow: the warp's F16 V tile
  // kBulk: stage s of this warp has landed when barriers[s] completes its phase (one arrival, the tile's bytes).
  uint64_t* barriers = reinterpret_cast<uint64_t*>(shared + kMmaWarps * kWarpStride) + warp * kStages;
  if constexpr (kBulk) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) init_mbarrier(barriers + s, 1);
      fence_mbarrier_init();
    }
    __syncwarp();
  }
  bool missing = false;

  // Copies tile k of this warp into stage `stage`: 8 lanes per row, each 16 bytes of every 128 bytes of the K and the
  // V row, rows lane / 8 + 4 r. One commit group per call, empty past the warp's tiles, so that wait_copies counts
  // tiles. `block`: kPerTileCopy's table entry of the tile's first position (tile_block(k)).
  constexpr int kLaneRows = kTileKeys / 4;
  const int64_t position_stride = key_rows_of_sequence.position_stride;
  int32_t lane_source[kLaneRows][kChunksPerLane];  // kPerTileCopy: element offsets in a tile, and shared targets
  uint32_t lane_target[kLaneRows][kChunksPerLane], lane_value_target[kLaneRows][kChunksPerLane];
#pragma unroll
  for (int r = 0; r < kLaneRows; ++r)
#pragma unroll
    for (int half = 0; half < kChunksPerLane; ++half) {
      const int key_row = lane / 8 + 4 * r, chunk = lane % 8 + 8 * half;
      lane_source[r][half] = static_cast<int32_t>(key_row * position_stride) + kChunkElements * chunk;
      lane_target[r][half] = static_cast<uint32_t>(copied<Pool>(key_row, chunk));
      lane_value_target[r][half] = static_cast<uint32_t>(copied_value<Pool, kValueRegisters>(key_row, chunk));
    }
  const bool tiles_in_blocks = pool.block_size >= kTileKeys;
  auto tile_block = [&](int32_t k) {
    return kPerTileCopy && tiles_in_blocks && k < warp_tiles
               ? key_rows_of_sequence.block_of((split_begin + warp + k * kMmaWarps) * kTileKeys)
               : -1;
  };
  auto issue = [&](int32_t k, int stage_index, int32_t block) {
    if constexpr (kBulk) {
      if (k >= warp_tiles) return;  // no wait looks for tiles past the warp's
      // Lane l: K row l % 16 (l < 16) or V row l % 16; one table entry for a tile inside the range and one block,
      // else each row's own; rows not copied (outside the range, or a missing block) zeroed, so that keys masked to
      // probability 0 meet finite values.
      const int32_t tile_first = (split_begin + warp + k * kMmaWarps) * kTileKeys;
      const int key_row = lane % kTileKeys;
      const int32_t t = tile_first + key_row;
      int32_t row_block = block;
      if (tiles_in_blocks && tile_first >= first && tile_first + kTileKeys - 1 <= last) {
        missing |= block < 0;
      } else {
        const bool visible = t >= first && t <= last;
        row_block = visible ? key_rows_of_sequence.block_of(t) : -1;
        missing |= visible && row_block < 0;
      }
      const bool copied_row = row_block >= 0;
      unsigned char* target = stages + stage_index * kStageStride + (lane >= kTileKeys ? kBulkTileBytes : 0) +
                              key_row * kBulkRowBytes;
      if (!copied_row) {
#pragma unroll
        for (int chunk = 0; chunk < kFastHeadDim / 16; ++chunk)
          reinterpret_cast<uint4*>(target)[chunk] = make_uint4(0u, 0u, 0u, 0u);
        fence_shared_for_async_copies();  // before a later tile's bulk copy into this row
      }
      const uint32_t copied_rows = __popc(__ballot_sync(0xffffffffu, copied_row));
      if (lane == 0) arrive_expecting_bytes(barriers + stage_index, copied_rows * kFastHeadDim);
      if (copied_row)
        copy_bulk(target, (lane >= kTileKeys ? v_pool : k_pool) + key_rows_of_sequence.offset(row_block, t),
                  kFastHeadDim, barriers + stage_index);
      return;
    }
    if (k < warp_tiles) {
      const int32_t tile = split_begin + warp + k * kMmaWarps;
      unsigned char* stage = stages + stage_index * kStageStride;
      const int32_t tile_first = tile * kTileKeys;
      if (kPerTileCopy && tiles_in_blocks && tile_first >= first && tile_first + kTileKeys - 1 <= last) {
        missing |= block < 0;
        const int64_t base = block >= 0 ? key_rows_of_sequence.offset(block, tile_first) : 0;
        const Pool* k_source = k_pool + base;
        const Pool* v_source = v_pool + base;
        const uint32_t target = shared_address(stage);
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r)
#pragma unroll
          for (int half = 0; half < kChunksPerLane; ++half) {
            copy_async16(target + lane_target[r][half], k_source + lane_source[r][half], block >= 0);
            copy_async16(target + kValueOffset + lane_value_target[r][half],
                         v_source + lane_source[r][half], block >= 0);
          }
        commit_copies();
        return;
      }
#pragma unroll
      for (int r = 0; r < kTileKeys / 4; ++r) {
        const int key_row = lane / 8 + 4 * r;
        const int32_t t = tile * kTileKeys + key_row;
        const bool visible = t >= first && t <= last;
        const int32_t block = visible ? key_rows_of_sequence.block_of(t) : -1;
        missing |= visible && block < 0;
        const int64_t offset = block >= 0 ? key_rows_of_sequence.offset(block, t) : 0;
#pragma unroll
        for (int half = 0; half < kChunksPerLane; ++half) {
          const int chunk = lane % 8 + 8 * half;
          copy_async16(stage + copied<Pool>(key_row, chunk), k_pool + offset + kChunkElements * chunk, block >= 0);
          copy_async16(stage + kValueOffset + copied_value<Pool, kValueRegisters>(key_row, chunk),
                       v_pool + offset + kChunkElements * chunk, block >= 0);
        }
      }
    }
    commit_copies();
  };

  // O^T fragments: m-tile i holds dims 16 i + fragment_row (+ 8) of heads 2 pair and 2 pair + 1. Each lane keeps
  // the running max of its two heads (the same in the 8 lanes sharing them) and a partial sum over its own keys.
  // kQueryRows: n-tile t holds dims 32 pair + t and 32 pair + 16 + t of head fragment_row, hi rows in [0], [1] and lo
  // rows in [2], [3]; lane's running max and partial sum are its head's, in [0].
  float acc[kAccTiles][4];
#pragma unroll
  for (int i = 0; i < kAccTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY}, partial_sum[2] = {0.0f, 0.0f};
  const int matrix = lane / 8, matrix_row = lane % 8;  // the ldmatrix address this lane gives

  // The first tiles' table entries, loaded together before the first copy needs one (not one round trip each).
  int32_t first_blocks[kStages];
#pragma unroll
  for (int k = 0; k < kStages; ++k) first_blocks[k] = tile_block(k);
  if constexpr (kEarly) {
    // The copies below may run before the kernel this one depends on ends (QueryRowsEarly): they wait for it when
    // one of their tiles reaches a position written this step (>= position - kDecodeMaxQueryRows + 1).
    const int32_t last_prologue_key = (split_begin + warp + (kStages - 2) * kMmaWarps) * kTileKeys + kTileKeys - 1;
    if (last_prologue_key > position - kDecodeMaxQueryRows) wait_for_prior_grids();
  }
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k, k, first_blocks[k]);
  if constexpr (kEarly) wait_for_prior_grids();  // before q, the later tiles and any write
  int32_t block_ahead = first_blocks[kStages - 1];  // the next tile to issue: its table entry one iteration early
  int issue_stage = kStages - 1, use_stage = 0;

  // B fragments of Q^T for each k-step, once the first copies are on their way: lane holds head fragment_row,
  // BF16: dims 16 s + 2 pair (+1) and the same + 8; E4M3: of dims 64 h + 16 pair + 4 j + (0..3) (kBulk:
  // 16 (2 pair + h) + 4 j + (0..3)), those the K words decode to, (0, 2) and (1, 3) for k-step 4 h + j, scaled by
  // 2^q_shift (one power of two for the warp). kQueryRows uses them as A fragments (query_rows_step).
  uint32_t q_hi[kDimSteps][2], q_lo[kDimSteps][2];
  float q_unscale = 1.0f;
  {
    const bool real_head = fragment_row < group;
    const float* query = q + (row * num_heads + int64_t{kv_head} * group + fragment_row) * kFastHeadDim;
    // Scores in base 2 (exp2 in the loop); E4M3 pools: k_scale folded in, as q · (code k_scale) = (q k_scale) · code.
    const float q_scale = scale * kLog2E * (kE4m3 ? kv_scale(pool, 0) : 1.0f);
    if constexpr (kE4m3) {
      float values[2][16];
      float amax = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 16; i += 4) {
          float4 v{0.0f, 0.0f, 0.0f, 0.0f};
          // The dims of the K chunk this lane reads for k-steps 4 h .. 4 h + 3 (query_rows_step's layouts).
          const int chunk = kBulk ? 2 * fragment_pair + h : 4 * h + fragment_pair;
          if (real_head) v = *reinterpret_cast<const float4*>(query + 16 * chunk + i);
          values[h][i] = v.x * q_scale;
          values[h][i + 1] = v.y * q_scale;
          values[h][i + 2] = v.z * q_scale;
          values[h][i + 3] = v.w * q_scale;
#pragma unroll
          for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(values[h][i + e]));
        }
      const int shift = f16_shift(warp_max(amax));
      const float up = ldexpf(1.0f, shift);
      q_unscale = ldexpf(1.0f, -shift);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          // The K word's codes pair as (0, 2) and (1, 3) by bit operations, as (0, 1) and (2, 3) by cvt.
          const float* v = values[h] + 4 * j;
          const int second = kKeysCvt ? 1 : 2, third = kKeysCvt ? 2 : 1;
          split_half2(v[0] * up, v[second] * up, q_hi[4 * h + j][0], q_lo[4 * h + j][0]);
          split_half2(v[third] * up, v[3] * up, q_hi[4 * h + j][1], q_lo[4 * h + j][1]);
        }
    } else {
#pragma unroll
      for (int s = 0; s < kDimSteps; ++s)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float2 pair{0.0f, 0.0f};
          if (real_head) pair = *reinterpret_cast<const float2*>(query + 16 * s + 2 * fragment_pair + 8 * half);
          split_pair(pair.x * q_scale, pair.y * q_scale, q_hi[s][half], q_lo[s][half]);
        }
    }
  }

  auto next_stage = [](int stage) { return stage == kStages - 1 ? 0 : stage + 1; };
  auto tile_first = [&](int32_t k) { return (split_begin + warp + k * kMmaWarps) * kTileKeys; };
  int32_t k = 0;
  if constexpr (kPairs) {
    // Tiles k and k + 1 (in stages k and k + 1 mod kStages) at a time: tile k + kStages - 1 issued before the wait
    // and k + kStages after the step (into tile k's stage), so that kStages - 2 tiles stay in flight.
    for (; k + 1 < warp_tiles; k += 2) {
      __syncwarp();  // every lane is past its reads of the stage the next copies overwrite
      issue(k + kStages - 1, issue_stage, block_ahead);
      block_ahead = tile_block(k + kStages);
      issue_stage = next_stage(issue_stage);
      wait_copies<kStages - 2>();
      __syncwarp();  // every lane's copies of tiles k and k + 1 have landed
      const unsigned char* const k_tiles[2] = {stages + use_stage * kStageStride,
                                               stages + next_stage(use_stage) * kStageStride};
      const unsigned char* const v_tiles[2] = {k_tiles[0] + kValueOffset, k_tiles[1] + kValueOffset};
      const int32_t firsts[2] = {tile_first(k), tile_first(k + 1)};
      use_stage = next_stage(next_stage(use_stage));
      query_rows_step<2, false, false, false>(k_tiles, v_tiles, q_hi, q_lo, q_unscale, firsts, first, last,
                                              running_max[0], partial_sum[0], acc);
      __syncwarp();
      issue(k + kStages, issue_stage, block_ahead);
      block_ahead = tile_block(k + kStages + 1);
      issue_stage = next_stage(issue_stage);
    }
  }
  for (; k < warp_tiles; ++k) {  // kPairs: the last tile of an odd count
    __syncwarp();  // every lane is past its reads of the stage the next copies overwrite
    issue(k + kStages - 1, issue_stage, block_ahead);
    block_ahead = tile_block(k + kStages);
    issue_stage = next_stage(issue_stage);
    if constexpr (kBulk)
      wait_mbarrier(barriers + use_stage, (k / kStages) & 1);  // the stage's (k / kStages)-th phase: tile k
    else
      wait_copies<kStages - 1>();
    __syncwarp();  // every lane's copies of tile k have landed
    const unsigned char* k_tile = stages + use_stage * kStageStride;
    use_stage = next_stage(use_stage);
    const unsigned char* v_tile = k_tile + kValueOffset;
    if constexpr (kQueryRows) {
      const unsigned char* const k_tiles[1] = {k_tile};
      const unsigned char* const v_tiles[1] = {v_tile};
      const int32_t firsts[1] = {tile_first(k)};
      query_rows_step<1, !kKeysCvt, kVersion == DecodeVersion::QueryRowsValuesBits, kBulk>(
          k_tiles, v_tiles, q_hi, q_lo, q_unscale, firsts, first, last, running_max[0], partial_sum[0], acc);
      continue;
    }

    // S^T: keys fragment_row and + 8 of the tile, heads 2 pair and + 1. hi and lo products in two accumulators
    // (two dependency chains).
    float score_hi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, score_lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint4 value_rows[4];  // kValueRegisters: keys 2c, 2c + 1, 2c + 8, 2c + 9 at dims 16 g .. 16 g + 15, raw
    if constexpr (kE4m3) {
      if constexpr (kValueRegisters) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int value_row = 2 * fragment_pair + (r & 1) + 8 * (r >> 1);
          value_rows[r] =
              *reinterpret_cast<const uint4*>(v_tile + copied_value<Pool, true>(value_row, fragment_row));
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 low = *reinterpret_cast<const uint4*>(k_tile + copied<Pool>(fragment_row, 4 * h + fragment_pair));
        const uint4 high =
            *reinterpret_cast<const uint4*>(k_tile + copied<Pool>(fragment_row + 8, 4 * h + fragment_pair));
        const uint32_t low_words[4] = {low.x, low.y, low.z, low.w}, high_words[4] = {high.x, high.y, high.z, high.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t a[4];  // key g dims (2c, 2c+1), key g+8 the same, key g dims (2c+8, 2c+9), key g+8 the same
          if constexpr (kKeysCvt) {
            a[0] = e4m3x2_to_half2(low_words[j]);
            a[2] = e4m3x2_to_half2(low_words[j] >> 16);
            a[1] = e4m3x2_to_half2(high_words[j]);
            a[3] = e4m3x2_to_half2(high_words[j] >> 16);
          } else {
            e4m3x4_to_half2(low_words[j], a[0], a[2]);
            e4m3x4_to_half2(high_words[j], a[1], a[3]);
          }
          mma_f16(score_hi, a, q_hi[4 * h + j][0], q_hi[4 * h + j][1]);
          mma_f16(score_lo, a, q_lo[4 * h + j][0], q_lo[4 * h + j][1]);
        }
      }
      if constexpr (!kValueRegisters) {
        // V to F16 (in element order, as ldmatrix reads it): lane takes 16 codes of rows lane / 8 + 4 i.
#pragma unroll
        for (int i = 0; i < kTileKeys / 4; ++i) {
          const int value_row = lane / 8 + 4 * i, chunk = lane % 8;
          const uint4 raw = *reinterpret_cast<const uint4*>(v_tile + copied<Pool>(value_row, chunk));
          const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
          uint32_t halves[8];
#pragma unroll
          for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int p = 0; p < 2; ++p) halves[2 * w + p] = e4m3x2_to_half2(words[w] >> (16 * p));
          *reinterpret_cast<uint4*>(staging + swizzled(value_row, 2 * chunk)) =
              make_uint4(halves[0], halves[1], halves[2], halves[3]);
          *reinterpret_cast<uint4*>(staging + swizzled(value_row, 2 * chunk + 1)) =
              make_uint4(halves[4], halves[5], halves[6], halves[7]);
        }
        v_tile = staging;
      }
    } else {
#pragma unroll
      for (int s = 0; s < kDimSteps; ++s) {
        uint32_t a[4];
        load_matrices(a, k_tile + swizzled(matrix_row + 8 * (matrix & 1), 2 * s + (matrix >> 1)));
        mma_bf16(score_hi, a, q_hi[s][0], q_hi[s][1]);
        mma_bf16(score_lo, a, q_lo[s][0], q_lo[s][1]);
      }
    }
    const int32_t key = (split_begin + warp + k * kMmaWarps) * kTileKeys + fragment_row;
    const bool visible_low = key >= first && key <= last, visible_high = key + 8 >= first && key + 8 <= last;
    float score[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool visible = j < 2 ? visible_low : visible_high;
      score[j] = visible ? (score_hi[j] + score_lo[j]) * q_unscale : -INFINITY;
    }

    // Online softmax per head over the tile's 16 keys (8 lanes share a head pair: xor over lane bits 2..4).
    float tile_max[2] = {fmaxf(score[0], score[2]), fmaxf(score[1], score[3])};
#pragma unroll
    for (int offset = 4; offset < 32; offset <<= 1)
#pragma unroll
      for (int h = 0; h < 2; ++h) tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], offset));
    const bool grew = tile_max[0] > running_max[0] || tile_max[1] > running_max[1];
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (tile_max[h] <= running_max[h]) continue;
        const float correction = exp2f(running_max[h] - tile_max[h]);  // 0 while the max was -inf
        partial_sum[h] *= correction;
#pragma unroll
        for (int i = 0; i < kDimSteps; ++i) {
          acc[i][h] *= correction;
          acc[i][h + 2] *= correction;
        }
        running_max[h] = tile_max[h];
      }
    }
    float probability[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      probability[j] = score[j] == -INFINITY ? 0.0f : exp2f(score[j] - running_max[j & 1]);
    partial_sum[0] += probability[0] + probability[2];
    partial_sum[1] += probability[1] + probability[3];
    // P^T's B fragments: keys 2 pair (+1) and + 8 of head fragment_row, from the S^T layout by transposing.
    uint32_t p_hi[2], p_lo[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if constexpr (kE4m3)
        split_half2(probability[2 * half] * kProbabilityScale, probability[2 * half + 1] * kProbabilityScale,
                    p_hi[half], p_lo[half]);
      else
        split_pair(probability[2 * half], probability[2 * half + 1], p_hi[half], p_lo[half]);
      p_hi[half] = transpose(p_hi[half]);
      p_lo[half] = transpose(p_lo[half]);
    }
    if constexpr (kE4m3 && !kValueRegisters) __syncwarp();  // every lane's part of the F16 V tile is written

#pragma unroll
    for (int i = 0; i < kDimSteps; ++i) {
      uint32_t a[4];
      if constexpr (kValueRegisters)
        value_fragment(value_rows, i, a);
      else
        load_matrices_transposed(a, v_tile + swizzled(matrix_row + 8 * (matrix >> 1), 2 * i + (matrix & 1)));
      if constexpr (kE4m3) {
        mma_f16(acc[i], a, p_hi[0], p_hi[1]);
        mma_f16(acc[i], a, p_lo[0], p_lo[1]);
      } else {
        mma_bf16(acc[i], a, p_hi[0], p_hi[1]);
        mma_bf16(acc[i], a, p_lo[0], p_lo[1]);
      }
    }
  }
  wait_copies<0>();  // the trailing empty groups, before the stages' memory is reused

  // A head's partial sums: kQueryRows over the 4 lanes of head fragment_row, else over the 8 lanes of each head pair.
  if constexpr (kQueryRows) {
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1)
      partial_sum[0] += __shfl_xor_sync(0xffffffffu, partial_sum[0], offset);
  } else {
#pragma unroll
    for (int offset = 4; offset < 32; offset <<= 1)
#pragma unroll
      for (int h = 0; h < 2; ++h) partial_sum[h] += __shfl_xor_sync(0xffffffffu, partial_sum[h], offset);
  }
  __syncthreads();  // every warp is done with its stages
  float* warp_acc = reinterpret_cast<float*>(shared);  // [warp][head][dim], warp_acc_index
  float* warp_max = warp_acc + kMmaWarps * kMmaHeads * kWarpAccStride;
  float* warp_sum = warp_max + kMmaWarps * kMmaHeads;
  // E4M3 pools: P's 2^14 taken out and v_scale applied (the sum of P times codes, times v_scale, is P times V).
  const float acc_scale = kE4m3 ? kv_scale(pool, 1) / kProbabilityScale : 1.0f;
  if constexpr (kQueryRows) {
    // n-tile t: dims 32 pair + t ([0] hi + [2] lo) and 32 pair + 16 + t ([1] + [3]) of head fragment_row.
#pragma unroll
    for (int t = 0; t < kAccTiles; ++t)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        warp_acc[warp_acc_index(warp, fragment_row, 32 * fragment_pair + 16 * half + t)] =
            (acc[t][half] + acc[t][2 + half]) * acc_scale;
    if (fragment_pair == 0) {
      warp_max[warp * kMmaHeads + fragment_row] = running_max[0];
      warp_sum[warp * kMmaHeads + fragment_row] = partial_sum[0];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kDimSteps; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // The m-tile's rows fragment_row and + 8: dims 16 i + row (kValueRegisters: 16 row + 2 i, value_fragment).
        const int head = 2 * fragment_pair + (j & 1);
        const int dim =
            kValueRegisters ? 16 * fragment_row + 2 * i + (j >> 1) : 16 * i + fragment_row + 8 * (j >> 1);
        warp_acc[warp_acc_index(warp, head, dim)] = acc[i][j] * acc_scale;
      }
    if (fragment_row == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        warp_max[warp * kMmaHeads + 2 * fragment_pair + h] = running_max[h];
        warp_sum[warp * kMmaHeads + 2 * fragment_pair + h] = partial_sum[h];
      }
    }
  }
  const bool poisoned = __syncthreads_or(missing) != 0;

  for (int index = threadIdx.x; index < group * kFastHeadDim; index += kMmaThreads) {
    const int h = index / kFastHeadDim, d = index % kFastHeadDim;
    float block_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) block_max = fmaxf(block_max, warp_max[w * kMmaHeads + h]);
    float sum = 0.0f, value = 0.0f;
    if (block_max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) {
        const float m = warp_max[w * kMmaHeads + h];
        const float weight = m == -INFINITY ? 0.0f : exp2f(m - block_max);
        sum += weight * warp_sum[w * kMmaHeads + h];
        value += weight * warp_acc[warp_acc_index(w, h, d)];
      }
    }
    const int32_t head = kv_head * group + h;
    if (splits == 1) {
      out[(row * num_heads + head) * kFastHeadDim + d] = poisoned ? quiet_nan() : (sum > 0.0f ? value / sum : 0.0f);
    } else {
      const int64_t index_of_split = (item * num_heads + head) * splits + split;
      partials[index_of_split * kFastHeadDim + d] = value;
      if (d == 0) {
        float* stats = partials + stats_offset(count, num_heads, splits);
        stats[2 * index_of_split] = block_max * kLn2;  // the merge weighs splits by exp (natural log units)
        stats[2 * index_of_split + 1] = poisoned ? quiet_nan() : sum;
      }
    }
  }
}

// out = Σ_s w_s acc_s / Σ_s w_s sum_s with w_s = exp(max_s − max): the softmax over all splits' keys. Thread s
// weighs split s (splits <= kMergeThreads), then warp w sums the accumulators of splits w, w + kMergeWarps, ...,
// four dims per lane: no thread walks all the splits one after another.
constexpr int kMergeWarps = kMergeThreads / 32;
static_assert(kFastHeadDim == 32 * 4, "a warp covers head_dim with one float4 per lane");

// early_dependents (QueryRowsEarly): the next kernel, a programmatic dependent, may launch before this one ends.
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const int32_t* rows, int64_t count,
                                                                     int32_t splits, const float* partials,
                                                                     int32_t num_heads, float* out,
                                                                     bool early_dependents) {
  __shared__ float weight[kMergeThreads];
  __shared__ float warp_result[kMergeWarps];
  __shared__ float4 warp_value[kMergeWarps][32];
  if (early_dependents) allow_dependent_launch();
  wait_for_prior_grids();  // the decode grid's partials are complete and visible
  const int64_t item = blockIdx.x;
  const int64_t row = rows != nullptr ? rows[item] : item;
  const int32_t head = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* stats = partials + stats_offset(count, num_heads, splits);
  const int64_t first_split = (item * num_heads + head) * splits;
  const int s = threadIdx.x;
  const float split_max = s < splits ? stats[2 * (first_split + s)] : -INFINITY;
  const float split_sum = s < splits ? stats[2 * (first_split + s) + 1] : 0.0f;
  const bool poisoned = __syncthreads_or(isnan(split_sum)) != 0;

  float total_max = warp_max(split_max);
  if (lane == 0) warp_result[warp] = total_max;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) total_max = fmaxf(total_max, warp_result[w]);
  const float split_weight = split_max == -INFINITY ? 0.0f : expf(split_max - total_max);
  weight[s] = split_weight;
  const float weighted_sum = warp_sum(split_weight * split_sum);
  __syncthreads();  // every warp has read warp_result's maxima
  if (lane == 0) warp_result[warp] = weighted_sum;
  __syncthreads();
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) sum += warp_result[w];

  const float4* accumulators = reinterpret_cast<const float4*>(partials + first_split * kFastHeadDim) + lane;
  float4 value{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (int t = warp; t < splits; t += kMergeWarps) {
    const float w = weight[t];
    const float4 a = accumulators[int64_t{t} * (kFastHeadDim / 4)];
    value.x += w * a.x;
    value.y += w * a.y;
    value.z += w * a.z;
    value.w += w * a.w;
  }
  warp_value[warp][lane] = value;
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w) {
    const float4 other = warp_value[w][lane];
    value.x += other.x;
    value.y += other.y;
    value.z += other.z;
    value.w += other.w;
  }
  float4 result{0.0f, 0.0f, 0.0f, 0.0f};
  if (sum > 0.0f) result = float4{value.x / sum, value.y / sum, value.z / sum, value.w / sum};
  if (poisoned) result = float4{quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan()};
  reinterpret_cast<float4*>(out + (row * num_heads + head) * kFastHeadDim)[lane] = result;
}

// The merge as a programmatic dependent of the decode grid just enqueued: its blocks may be scheduled before that
// grid ends (they wait in griddepcontrol.wait), so no launch gap separates the two.
cudaError_t launch_merge(const int32_t* rows, int64_t count, int32_t splits, const float* partials, int32_t num_heads,
                         float* out, cudaStream_t stream, bool early_dependents = false) {
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned int>(count), static_cast<unsigned int>(num_heads));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, merge_splits_kernel, rows, count, splits, partials, num_heads, out,
                            early_dependents);
}

template <typename P, int kGroup>
cudaError_t launch_decode(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                          const int32_t* rows, int64_t count, int32_t splits, float* partials, int32_t num_heads,
                          float scale, int32_t sliding_window, float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(count), static_cast<unsigned int>(pool.num_kv_heads),
                  static_cast<unsigned int>(splits));
  decode_attention_kernel<P, kGroup><<<grid, kDecodeThreads, 0, stream>>>(
      q, pool, slot, batch, rows, count, splits, partials, num_heads, scale, sliding_window, out);
  if (splits == 1) return cudaGetLastError();
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  return launch_merge(rows, count, splits, partials, num_heads, out, stream);
}

template <typename Pool, DecodeVersion kVersion>
cudaError_t allow_mma_shared_memory() {
  static const cudaError_t status = cudaFuncSetAttribute(
      decode_attention_mma_kernel<Pool, kVersion>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      DecodeLayout<Pool, kVersion>::kSharedBytes);
  return status;
}

template <typename Pool, DecodeVersion kVersion>
cudaError_t launch_decode_mma_version(const float* q, const PoolGeometry& pool, int32_t slot,
                                      const BatchGeometry& batch, const int32_t* rows, int64_t count, int32_t splits,
                                      float* partials, int32_t num_heads, float scale, int32_t sliding_window,
                                      float* out, cudaStream_t stream) {
  if (const cudaError_t status = allow_mma_shared_memory<Pool, kVersion>(); status != cudaSuccess) return status;
  // kv heads fastest: the blocks running together read all heads of the same positions (whole pool rows).
  const dim3 grid(static_cast<unsigned int>(count * pool.num_kv_heads), static_cast<unsigned int>(splits));
  constexpr bool kEarly = sizeof(Pool) == 1 && kVersion == DecodeVersion::QueryRowsEarly;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kMmaThreads);
  config.dynamicSmemBytes = DecodeLayout<Pool, kVersion>::kSharedBytes;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = kEarly ? 1 : 0;
  if (const cudaError_t status = cudaLaunchKernelEx(&config, decode_attention_mma_kernel<Pool, kVersion>, q, pool, slot,
                                                    batch, rows, count, splits, partials, num_heads, scale,
                                                    sliding_window, out);
      status != cudaSuccess || splits == 1)
    return status;
  return launch_merge(rows, count, splits, partials, num_heads, out, stream, kEarly);
}

// The version BEAMLINE_CUDA_DECODE_ATTENTION names (common/kernel_variant.h lists the names in this order; unset:
// QueryRows, the fastest over E4M3 pools on the H200, 74-78% of the roof against PerTile's 71%, session9-final).
// keys-cvt and the query-rows versions are PerTile for BF16 pools (nothing to decode).
DecodeVersion decode_version() {
  static const DecodeVersion version = [] {
    constexpr DecodeVersion kByName[] = {
        DecodeVersion::QueryRows,      DecodeVersion::PerTile,           DecodeVersion::PerRow,
        DecodeVersion::PerTileKeysCvt, DecodeVersion::QueryRowsKeysBits, DecodeVersion::QueryRowsValuesBits,
        DecodeVersion::QueryRowsBulk,  DecodeVersion::QueryRowsTwoBlocks, DecodeVersion::QueryRowsEarly,
        DecodeVersion::QueryRowsPairs};
    static_assert(std::size(kByName) == std::size(kDecodeAttentionNames), "one version per name");
    const int index = kernel_variant_index(kDecodeAttentionFamily);
    return kByName[index < 0 ? 0 : index];
  }();
  return version;
}

template <DecodeVersion kVersion>
using VersionTag = std::integral_constant<DecodeVersion, kVersion>;

// Calls body(VersionTag<v>{}) for the version v of the list that `version` names, the list's last when it names none.
template <DecodeVersion kFirst, DecodeVersion... kRest, typename Body>
cudaError_t visit_version(DecodeVersion version, const Body& body) {
  if constexpr (sizeof...(kRest) == 0) {
    return body(VersionTag<kFirst>{});
  } else {
    if (version == kFirst) return body(VersionTag<kFirst>{});
    return visit_version<kRest...>(version, body);
  }
}

// The same over the versions a pool's dtype has (decode_version()'s).
template <typename Pool, typename Body>
cudaError_t visit_pool_version(const Body& body) {
  const DecodeVersion version = decode_version();
  if constexpr (sizeof(Pool) == 1)
    return visit_version<DecodeVersion::PerRow, DecodeVersion::PerTileKeysCvt, DecodeVersion::QueryRows,
                         DecodeVersion::QueryRowsKeysBits, DecodeVersion::QueryRowsValuesBits,
                         DecodeVersion::QueryRowsBulk, DecodeVersion::QueryRowsTwoBlocks, DecodeVersion::QueryRowsEarly,
                         DecodeVersion::QueryRowsPairs, DecodeVersion::PerTile>(version, body);
  else
    return visit_version<DecodeVersion::PerRow, DecodeVersion::PerTile>(version, body);
}

template <typename Pool>
cudaError_t launch_decode_mma(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                              const int32_t* rows, int64_t count, int32_t splits, float* partials, int32_t num_heads,
                              float scale, int32_t sliding_window, float* out, cudaStream_t stream) {
  return visit_pool_version<Pool>([&](auto version) {
    return launch_decode_mma_version<Pool, decltype(version)::value>(q, pool, slot, batch, rows, count, splits,
                                                                      partials, num_heads, scale, sliding_window, out,
                                                                      stream);
  });
}

template <typename P, int kGroup>
int blocks_per_multiprocessor() {
  static const int blocks = [] {
    int result = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&result, decode_attention_kernel<P, kGroup>, kDecodeThreads, 0) !=
        cudaSuccess)
      result = 1;
    return result;
  }();
  return blocks;
}

// Calls body.template run<P, kGroup>() (the CUDA-core kernel of F32 and E4M3 pools) for the group rounded up to 4, 6
// or 8 (heads past the group are computed on zeros and never stored; small groups stay correct, not fast).
template <typename P, typename Body>
cudaError_t dispatch_group(int32_t group, const Body& body) {
  if (group <= 4) return body.template run<P, 4>();
  if (group <= 6) return body.template run<P, 6>();
  return body.template run<P, 8>();
}

template <typename Body>
cudaError_t dispatch_pool(DType dtype, int32_t group, const Body& body) {
  if (dtype == DType::F32) return dispatch_group<float>(group, body);
  return cudaErrorInvalidValue;
}

template <typename Pool, DecodeVersion kVersion>
int mma_blocks_per_multiprocessor() {
  static const int blocks = [] {
    int result = 1;
    if (allow_mma_shared_memory<Pool, kVersion>() != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&result, decode_attention_mma_kernel<Pool, kVersion>,
                                                      kMmaThreads, DecodeLayout<Pool, kVersion>::kSharedBytes) !=
            cudaSuccess)
      result = 1;
    return std::max(result, 1);
  }();
  return blocks;
}

// The selected version's blocks per multiprocessor (the plan's splits fill them).
template <typename Pool>
int selected_blocks_per_multiprocessor() {
  int blocks = 1;
  visit_pool_version<Pool>([&](auto version) {
    blocks = mma_blocks_per_multiprocessor<Pool, decltype(version)::value>();
    return cudaSuccess;
  });
  return blocks;
}

struct DecodeLaunch {
  const float* q;
  const PoolGeometry& pool;
  int32_t slot;
  const BatchGeometry& batch;
  const int32_t* rows;
  int64_t count;
  int32_t splits;
  float* partials;
  int32_t num_heads;
  float scale;
  int32_t sliding_window;
  float* out;
  cudaStream_t stream;
  template <typename P, int kGroup>
  cudaError_t run() const {
    return launch_decode<P, kGroup>(q, pool, slot, batch, rows, count, splits, partials, num_heads, scale,
                                    sliding_window, out, stream);
  }
};

struct OccupancyQuery {
  int* blocks;
  template <typename P, int kGroup>
  cudaError_t run() const {
    *blocks = blocks_per_multiprocessor<P, kGroup>();
    return cudaSuccess;
  }
};

}  // namespace

cudaError_t launch_decode_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                                    const int32_t* rows, int64_t count, int32_t splits, float* partials,
                                    int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                    cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (splits > kMergeThreads) return cudaErrorInvalidValue;
  if (pool.dtype == DType::BF16)
    return launch_decode_mma<__nv_bfloat16>(q, pool, slot, batch, rows, count, splits, partials, num_heads, scale,
                                            sliding_window, out, stream);
  if (pool.dtype == DType::F8_E4M3)
    return launch_decode_mma<E4m3>(q, pool, slot, batch, rows, count, splits, partials, num_heads, scale,
                                   sliding_window, out, stream);
  return dispatch_pool(pool.dtype, num_heads / pool.num_kv_heads,
                       DecodeLaunch{q, pool, slot, batch, rows, count, splits, partials, num_heads, scale,
                                    sliding_window, out, stream});
}

int decode_blocks_per_multiprocessor(DType dtype, int32_t group) {
  if (dtype == DType::BF16) return selected_blocks_per_multiprocessor<__nv_bfloat16>();
  if (dtype == DType::F8_E4M3) return selected_blocks_per_multiprocessor<E4m3>();
  int blocks = 1;
  dispatch_pool(dtype, group, OccupancyQuery{&blocks});
  return blocks;
}

int64_t decode_partials_floats(int64_t count, int32_t num_heads, int32_t splits) {
  return splits == 1 ? 0 : count * num_heads * splits * (kFastHeadDim + 2);
}

}  // namespace beamline::cuda
