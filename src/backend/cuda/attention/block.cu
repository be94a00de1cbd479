// The block drafter's attention (Backend::block_attention): every block row of a draft layer in one launch, where
// the drafter's B one-row paged_attention calls per layer each re-read the same window. A block of threads serves one
// drafting sequence, one kv head and up to kPairsPerBlock (block row, query head of the group) pairs: the window's
// keys are read from the pool once per tile (vector loads, block addresses looked up once per key) into shared
// memory and every pair of the block scores them; each warp keeps kPairsPerWarp pairs' online softmax (running max
// and sum) in registers. A pair sees the keys from its row's window start to the sequence's last key, so the tiles
// begin at the block's first row's window start and a pair skips the tiles it does not see.
#include <cmath>

#include <cuda_runtime.h>

#include "backend/cuda/attention/attention_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeysPerTile = 32;  // one key per lane when scoring
// One pair per warp: at batch 1 (a drafter's typical 16 pairs per kv head) two blocks per kv head, so the scoring
// latency of a tile is one pair's, not two.
constexpr int kPairsPerWarp = 1;
constexpr int kPairsPerBlock = kWarps * kPairsPerWarp;
constexpr int kChunk = 4;  // pool elements per vector load (head_dim is a multiple of it)
constexpr int64_t kPastLastKey = -2, kMissingBlock = -1;

__device__ __forceinline__ void load_chunk(const float* p, float (&out)[kChunk]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}
// Four BF16 values, exactly (a BF16 is the top half of an F32).
__device__ __forceinline__ void load_chunk(const __nv_bfloat16* p, float (&out)[kChunk]) {
  const uint2 bits = *reinterpret_cast<const uint2*>(p);
  out[0] = __uint_as_float(bits.x << 16);
  out[1] = __uint_as_float(bits.x & 0xffff0000u);
  out[2] = __uint_as_float(bits.y << 16);
  out[3] = __uint_as_float(bits.y & 0xffff0000u);
}
__device__ __forceinline__ void load_chunk(const E4m3* p, float (&out)[kChunk]) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) out[j] = to_float(p[j]);
}

// Shared memory: q of the block's pairs [kPairsPerBlock][D], a K tile [32][D + 1] (padded: lane i reads row i), a
// V tile [32][D] (lanes read along D).
template <typename P, int kDimsPerLane>
__global__ void __launch_bounds__(kThreads)
    block_attention_kernel(const float* q, PoolGeometry pool, int32_t slot, BatchGeometry blocks, int32_t block,
                           int32_t num_heads, float scale, int32_t sliding_window, float* out) {
  extern __shared__ float shared[];
  __shared__ int64_t key_offset[kKeysPerTile];  // pool offset of each key of the tile, or kPastLastKey / kMissingBlock
  const int32_t dim = pool.head_dim, group = num_heads / pool.num_kv_heads;
  float* q_tile = shared;
  float* k_tile = q_tile + kPairsPerBlock * dim;
  float* v_tile = k_tile + kKeysPerTile * (dim + 1);

  const auto sequences = static_cast<int32_t>(blocks.rows);
  const int32_t sequence = blockIdx.x, kv_head = blockIdx.y;
  const int32_t first_pair = static_cast<int32_t>(blockIdx.z) * kPairsPerBlock;
  const int32_t pairs = min(kPairsPerBlock, block * group - first_pair);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t end = blocks.seq_lens[sequence], last = end - 1;
  // Block row i is at position end - block + i; pair (i, g) is number i * group + g.
  auto row_position = [&](int32_t pair) { return end - block + pair / group; };
  auto first_key = [&](int32_t pair) {
    return sliding_window > 0 ? max(int64_t{0}, row_position(pair) - sliding_window + 1) : int64_t{0};
  };
  auto q_offset = [&](int32_t pair) {  // of the pair's query vector in q and out
    const int64_t row = int64_t{pair / group} * sequences + sequence;
    return (row * num_heads + int64_t{kv_head} * group + pair % group) * dim;
  };

  for (int i = threadIdx.x; i < pairs * dim; i += blockDim.x)
    q_tile[i] = q[q_offset(first_pair + i / dim) + i % dim];

  float accumulator[kPairsPerWarp][kDimsPerLane];
  float running_max[kPairsPerWarp], running_sum[kPairsPerWarp];
  int64_t pair_first[kPairsPerWarp];
  bool poisoned[kPairsPerWarp];
#pragma unroll
  for (int j = 0; j < kPairsPerWarp; ++j) {
    const int local = warp + j * kWarps;
    pair_first[j] = local < pairs ? first_key(first_pair + local) : end;
    running_max[j] = -INFINITY;
    running_sum[j] = 0.0f;
    poisoned[j] = false;
#pragma unroll
    for (int d = 0; d < kDimsPerLane; ++d) accumulator[j][d] = 0.0f;
  }
  const P* k_pool = static_cast<const P*>(pool.k);
  const P* v_pool = static_cast<const P*>(pool.v);
  const float k_scale = kv_scale(pool, 0), v_scale = kv_scale(pool, 1);
  const int chunks = dim / kChunk;

  for (int64_t tile_start = first_key(first_pair); tile_start <= last; tile_start += kKeysPerTile) {
    __syncthreads();  // the previous tile is consumed (and q is loaded before the first)
    if (threadIdx.x < kKeysPerTile) {
      const int64_t t = tile_start + threadIdx.x;
      int64_t offset = kPastLastKey;
      if (t <= last) {
        const int32_t pool_block = lookup_block(pool, blocks, sequence, t);
        offset = pool_block < 0 ? kMissingBlock : pool_offset(pool, pool_block, slot, t, kv_head);
      }
      key_offset[threadIdx.x] = offset;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kKeysPerTile * chunks; i += blockDim.x) {
      const int key = i / chunks, d = (i % chunks) * kChunk;
      const int64_t offset = key_offset[key];
      float k_values[kChunk] = {}, v_values[kChunk] = {};
      if (offset >= 0) {
        load_chunk(k_pool + offset + d, k_values);
        load_chunk(v_pool + offset + d, v_values);
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        k_tile[key * (dim + 1) + d + j] = k_values[j] * k_scale;
        v_tile[key * dim + d + j] = v_values[j] * v_scale;
      }
    }
    __syncthreads();

    const int64_t t = tile_start + lane;
    const bool lane_missing = key_offset[lane] == kMissingBlock;
#pragma unroll
    for (int j = 0; j < kPairsPerWarp; ++j) {
      const int local = warp + j * kWarps;
      if (local >= pairs) continue;  // the same for the whole warp
      const bool visible = t >= pair_first[j] && t <= last;
      float score = -INFINITY;
      if (visible) {
        const float* query = q_tile + local * dim;
        const float* key = k_tile + lane * (dim + 1);
        float dot = 0.0f;
        for (int d = 0; d < dim; ++d) dot += query[d] * key[d];
        score = scale * dot;
      }
      const bool sees_missing = __any_sync(0xffffffffu, visible && lane_missing) != 0;
      poisoned[j] = poisoned[j] || sees_missing;
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;  // no key of this tile is the pair's (the same for the whole warp)
      const float new_max = fmaxf(running_max[j], tile_max);
      const float probability = visible ? expf(score - new_max) : 0.0f;
      const float correction = expf(running_max[j] - new_max);
      running_sum[j] = running_sum[j] * correction + warp_sum(probability);
      running_max[j] = new_max;
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) accumulator[j][d] *= correction;
      for (int key = 0; key < kKeysPerTile; ++key) {
        const float p = __shfl_sync(0xffffffffu, probability, key);
#pragma unroll
        for (int d = 0; d < kDimsPerLane; ++d) {
          const int column = lane + 32 * d;
          if (column < dim) accumulator[j][d] += p * v_tile[key * dim + column];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPairsPerWarp; ++j) {
    const int local = warp + j * kWarps;
    if (local >= pairs) continue;
    const float inverse = running_sum[j] > 0.0f ? 1.0f / running_sum[j] : 0.0f;
    float* result = out + q_offset(first_pair + local);
#pragma unroll
    for (int d = 0; d < kDimsPerLane; ++d) {
      const int column = lane + 32 * d;
      if (column < dim) result[column] = poisoned[j] ? quiet_nan() : accumulator[j][d] * inverse;
    }
  }
}

template <typename P, int kDimsPerLane>
cudaError_t launch(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& blocks, int32_t block,
                   int32_t num_heads, float scale, int32_t sliding_window, float* out, cudaStream_t stream) {
  const int32_t dim = pool.head_dim, group = num_heads / pool.num_kv_heads;
  const size_t shared_bytes =
      sizeof(float) * (static_cast<size_t>(kPairsPerBlock) * dim + kKeysPerTile * (dim + 1) + kKeysPerTile * dim);
  auto kernel = block_attention_kernel<P, kDimsPerLane>;
  if (shared_bytes > 48 * 1024) {
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
    if (status != cudaSuccess) return status;
  }
  const int64_t pair_blocks = (int64_t{block} * group + kPairsPerBlock - 1) / kPairsPerBlock;
  const dim3 grid(static_cast<unsigned int>(blocks.rows), static_cast<unsigned int>(pool.num_kv_heads),
                  static_cast<unsigned int>(pair_blocks));
  kernel<<<grid, kThreads, shared_bytes, stream>>>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out);
  return cudaGetLastError();
}

template <typename P>
cudaError_t launch_for_pool(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& blocks,
                            int32_t block, int32_t num_heads, float scale, int32_t sliding_window, float* out,
                            cudaStream_t stream) {
  const int32_t dim = pool.head_dim;
  if (dim <= 32) return launch<P, 1>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
  if (dim <= 64) return launch<P, 2>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
  if (dim <= 128) return launch<P, 4>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
  return launch<P, 8>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
}

}  // namespace

bool block_attention_supported(int32_t head_dim) {
  return head_dim > 0 && head_dim <= kMaxAttentionHeadDim && head_dim % kChunk == 0;
}

cudaError_t block_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& blocks,
                            int32_t block, int32_t num_heads, float scale, int32_t sliding_window, float* out,
                            cudaStream_t stream) {
  if (blocks.rows == 0 || block <= 0) return cudaSuccess;
  if (!block_attention_supported(pool.head_dim) || pool.num_kv_heads <= 0 || num_heads % pool.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  if (pool.dtype == DType::F32)
    return launch_for_pool<float>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
  if (pool.dtype == DType::BF16)
    return launch_for_pool<__nv_bfloat16>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
  if (pool.dtype == DType::F8_E4M3)
    return launch_for_pool<E4m3>(q, pool, slot, blocks, block, num_heads, scale, sliding_window, out, stream);
  return cudaErrorInvalidValue;
}

}  // namespace beamline::cuda
