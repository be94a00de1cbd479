// Paged KV writes, and paged attention's dispatcher: the host-side plan picks, per batch, the split-KV decode
// kernel (attention/decode.cu) for sequences with few query rows, the tiled prefill kernels (on the tensor
// cores for BF16 pools: attention/prefill_wgmma.cu with BF16 operands, attention/prefill_mma.cu
// with split ones; attention/prefill.cu for F32 pools; for FP8 pools the BF16 kernels over a shadow that
// attention/fp8_shadow.cu widens) for the others, and the generic kernel below for shapes those do not cover.
// The generic kernel: a block serves one row and one KV head; its warps are the query heads of that group, so
// each K/V tile read from the pool is shared by the whole group; softmax is online (running max and sum).
#include <cmath>

#include <algorithm>
#include <climits>
#include <cuda_runtime.h>

#include "backend/cuda/attention/attention_common.cuh"
#include "backend/cuda/common/kernel_variant.h"
#include "kv/kv_cache_layout.h"

namespace beamline::cuda {
namespace {

constexpr int kKeysPerTile = 32;  // one key per lane when scoring
constexpr int kWriteThreads = 256;

template <typename P>
__global__ void write_kv_kernel(const float* k, const float* v, PoolGeometry pool, int32_t slot, BatchGeometry batch) {
  const int64_t width = int64_t{pool.num_kv_heads} * pool.head_dim;
  const int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index >= batch.rows * width) return;
  const int64_t row = index / width, column = index % width;
  const int32_t position = batch.positions[row];
  const int32_t block = lookup_block(pool, batch, batch.row_sequence[row], position);
  if (block < 0) return;
  const int64_t offset = pool_offset(pool, block, slot, position, 0) + column;
  // IEEE division, as the CPU backend divides, so that both round the same quotient to the same code.
  static_cast<P*>(pool.k)[offset] = from_float<P>(__fdiv_rn(k[index], kv_scale(pool, 0)));
  static_cast<P*>(pool.v)[offset] = from_float<P>(__fdiv_rn(v[index], kv_scale(pool, 1)));
}

// Shared memory: q of the group's heads [group][D], a K tile [32][D + 1] (padded: lane i reads row i), a V tile
// [32][D] (lanes read along D).
template <typename P, int kDimsPerLane>
__global__ void paged_attention_kernel(const float* q, PoolGeometry pool, int32_t slot, BatchGeometry batch,
                                       int32_t num_heads, float scale, int32_t sliding_window, float* out) {
  extern __shared__ float shared[];
  const int32_t dim = pool.head_dim, group = num_heads / pool.num_kv_heads;
  float* q_tile = shared;
  float* k_tile = q_tile + group * dim;
  float* v_tile = k_tile + kKeysPerTile * (dim + 1);
  __shared__ int missing_block;

  const int64_t row = blockIdx.x;
  const int32_t kv_head = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t head = kv_head * group + warp;
  const int32_t sequence = batch.row_sequence[row];
  const int64_t position = batch.positions[row];
  const int64_t first = sliding_window > 0 ? max(int64_t{0}, position - sliding_window + 1) : 0;
  const int64_t last = min(position, int64_t{batch.seq_lens[sequence]} - 1);

  for (int i = threadIdx.x; i < group * dim; i += blockDim.x)
    q_tile[i] = q[(row * num_heads + int64_t{kv_head} * group) * dim + i];
  if (threadIdx.x == 0) missing_block = 0;

  float accumulator[kDimsPerLane];
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) accumulator[j] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  const P* k_pool = static_cast<const P*>(pool.k);
  const P* v_pool = static_cast<const P*>(pool.v);
  const float k_scale = kv_scale(pool, 0), v_scale = kv_scale(pool, 1);

  for (int64_t tile_start = first; tile_start <= last; tile_start += kKeysPerTile) {
    __syncthreads();  // the previous tile is consumed (and q is loaded before the first)
    for (int i = threadIdx.x; i < kKeysPerTile * dim; i += blockDim.x) {
      const int key = i / dim, d = i % dim;
      const int64_t t = tile_start + key;
      float k_value = 0.0f, v_value = 0.0f;
      if (t <= last) {
        const int32_t block = lookup_block(pool, batch, sequence, t);
        if (block < 0) {
          missing_block = 1;
        } else {
          const int64_t offset = pool_offset(pool, block, slot, t, kv_head) + d;
          k_value = to_float(k_pool[offset]) * k_scale;
          v_value = to_float(v_pool[offset]) * v_scale;
        }
      }
      k_tile[key * (dim + 1) + d] = k_value;
      v_tile[key * dim + d] = v_value;
    }
    __syncthreads();

    const int64_t key_position = tile_start + lane;
    float score = -INFINITY;
    if (key_position <= last) {
      const float* query = q_tile + warp * dim;
      const float* key = k_tile + lane * (dim + 1);
      float dot = 0.0f;
      for (int d = 0; d < dim; ++d) dot += query[d] * key[d];
      score = scale * dot;
    }
    const float tile_max = warp_max(score);
    const float new_max = fmaxf(running_max, tile_max);
    const float probability = key_position <= last ? expf(score - new_max) : 0.0f;
    const float correction = expf(running_max - new_max);
    running_sum = running_sum * correction + warp_sum(probability);
    running_max = new_max;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) accumulator[j] *= correction;
    for (int key = 0; key < kKeysPerTile; ++key) {
      const float p = __shfl_sync(0xffffffffu, probability, key);
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < dim) accumulator[j] += p * v_tile[key * dim + d];
      }
    }
  }
  __syncthreads();
  const bool poisoned = missing_block != 0;
  const float inverse = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
  float* result = out + (row * num_heads + head) * dim;
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < dim) result[d] = poisoned ? __int_as_float(0x7fc00000) : accumulator[j] * inverse;
  }
}

template <typename P, int kDimsPerLane>
cudaError_t launch_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                             int32_t num_heads, float scale, int32_t sliding_window, float* out, cudaStream_t stream) {
  const int32_t group = num_heads / pool.num_kv_heads, dim = pool.head_dim;
  const size_t shared_bytes =
      sizeof(float) * (static_cast<size_t>(group) * dim + kKeysPerTile * (dim + 1) + kKeysPerTile * dim);
  auto kernel = paged_attention_kernel<P, kDimsPerLane>;
  if (shared_bytes > 48 * 1024) {
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
    if (status != cudaSuccess) return status;
  }
  const dim3 grid(static_cast<unsigned int>(batch.rows), static_cast<unsigned int>(pool.num_kv_heads));
  kernel<<<grid, 32 * group, shared_bytes, stream>>>(q, pool, slot, batch, num_heads, scale, sliding_window, out);
  return cudaGetLastError();
}

template <typename P>
cudaError_t attention_for_pool(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                               int32_t num_heads, float scale, int32_t sliding_window, float* out,
                               cudaStream_t stream) {
  const int32_t dim = pool.head_dim;
  if (dim <= 32) return launch_attention<P, 1>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  if (dim <= 64) return launch_attention<P, 2>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  if (dim <= 128) return launch_attention<P, 4>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  return launch_attention<P, 8>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
}

}  // namespace

cudaError_t write_kv(const float* k, const float* v, const PoolGeometry& pool, int32_t slot,
                     const BatchGeometry& batch, cudaStream_t stream) {
  const int64_t n = batch.rows * pool.num_kv_heads * pool.head_dim;
  if (n == 0) return cudaSuccess;
  const unsigned int blocks = blocks_for(n, kWriteThreads);
  if (pool.dtype == DType::F32) {
    write_kv_kernel<float><<<blocks, kWriteThreads, 0, stream>>>(k, v, pool, slot, batch);
  } else if (pool.dtype == DType::BF16) {
    write_kv_kernel<__nv_bfloat16><<<blocks, kWriteThreads, 0, stream>>>(k, v, pool, slot, batch);
  } else if (pool.dtype == DType::F8_E4M3) {
    write_kv_kernel<E4m3><<<blocks, kWriteThreads, 0, stream>>>(k, v, pool, slot, batch);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_generic_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                                     int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                     cudaStream_t stream) {
  if (pool.dtype == DType::F32)
    return attention_for_pool<float>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  if (pool.dtype == DType::BF16)
    return attention_for_pool<__nv_bfloat16>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  if (pool.dtype == DType::F8_E4M3)
    return attention_for_pool<E4m3>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  return cudaErrorInvalidValue;
}

namespace {

constexpr int32_t kMinKeysPerSplit = 128;  // 64 KiB of BF16 K and V per block at head_dim 128
constexpr int32_t kMaxSplits = 128;
constexpr int64_t kBlockOverheadKeys = 64;  // a block's fixed cost (q load, combining its slots, the merge), in keys

int multiprocessors() {
  static const int count = [] {
    int device = 0, result = 1;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&result, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      result = 1;
    return result;
  }();
  return count;
}

// BEAMLINE_CUDA_DECODE_SPLITS: 1 (auto: the cost model's choice), or 2, 3, 4 times it ("2x", "3x", "4x"; the names'
// order in common/kernel_variant.h), for the GPU to rank: more and shorter blocks, several waves, so that blocks
// starting late (their first loads' latency) overlap blocks streaming, against more partials to combine.
int64_t splits_factor() {
  static const int64_t factor = std::max(0, kernel_variant_index(kDecodeSplitsFamily)) + 1;
  return factor;
}

// Splits per (row, kv head): the fewest that minimise waves x (keys per block + a block's fixed cost), waves
// counted in resident blocks (a wave that is only partly full still takes a whole block's time); times
// splits_factor() within the same bounds.
int32_t choose_splits(int64_t pairs, int64_t keys, DType dtype, int32_t group) {
  const int64_t capacity = int64_t{multiprocessors()} * decode_blocks_per_multiprocessor(dtype, group);
  const int64_t most = std::clamp<int64_t>((keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit, 1, kMaxSplits);
  int32_t best = 1;
  int64_t best_cost = INT64_MAX;
  for (int64_t splits = 1; splits <= most; ++splits) {
    const int64_t waves = (pairs * splits + capacity - 1) / capacity;
    const int64_t cost = waves * ((keys + splits - 1) / splits + kBlockOverheadKeys);
    if (cost < best_cost) {
      best_cost = cost;
      best = static_cast<int32_t>(splits);
    }
  }
  return static_cast<int32_t>(std::min(most, best * splits_factor()));
}

}  // namespace

AttentionPlan plan_attention(const AttentionHostBatch& batch, const PoolGeometry& pool, int32_t num_heads,
                             int32_t sliding_window, bool aligned, OperandPrecision precision) {
  AttentionPlan plan;
  plan.precision = precision;
  const int32_t group = num_heads / pool.num_kv_heads;
  const bool power_of_two_blocks = pool.block_size > 0 && (pool.block_size & (pool.block_size - 1)) == 0;
  plan.generic = pool.head_dim != kFastHeadDim || group > kFastMaxGroup || !power_of_two_blocks || !aligned;
  if (plan.generic) return plan;
  // FP8 pools: the split-KV decode kernel reads them; the tiled prefill kernels read a BF16 shadow of the keys
  // their tiles see (AttentionPlan::shadow_blocks), so their tiles are planned for a BF16 pool.
  const bool shadowed = pool.dtype == DType::F8_E4M3;
  const DType tile_dtype = shadowed ? DType::BF16 : pool.dtype;
  std::vector<ShadowSequence> shadow(static_cast<std::size_t>(batch.sequences), ShadowSequence{0, 0, 0});
  std::vector<int32_t> decode_rows;
  struct Tile {
    int32_t sequence, first_row, rows;
    int64_t keys;
  };
  std::vector<Tile> tiles;
  int64_t decode_keys = 1;
  const int32_t rows_per_tile = prefill_rows_per_tile(group, tile_dtype);
  auto visible_range = [&](int32_t sequence, int64_t position) {
    const int64_t first = first_visible_position(position, sliding_window);
    const int64_t last = std::min<int64_t>(position, int64_t{batch.seq_lens[sequence]} - 1);
    return std::pair{first, last};
  };
  for (int32_t s = 0; s < batch.sequences; ++s) {
    const int32_t begin = batch.query_start[s], end = batch.query_start[s + 1];
    shadow[static_cast<std::size_t>(s)].base = static_cast<int32_t>(plan.shadow_blocks);  // bases never decrease
    if (end - begin <= kDecodeMaxQueryRows) {
      for (int32_t row = begin; row < end; ++row) {
        decode_rows.push_back(row);
        const auto [first, last] = visible_range(s, batch.positions[row]);
        decode_keys = std::max(decode_keys, last - first + 1);
      }
      continue;
    }
    int64_t first_key = INT64_MAX, last_key = -1;
    for (int32_t row = begin; row < end; row += rows_per_tile) {
      const int32_t rows = std::min(rows_per_tile, end - row);
      const int64_t first = visible_range(s, batch.positions[row]).first;
      const int64_t last = visible_range(s, batch.positions[row + rows - 1]).second;
      tiles.push_back({s, row, rows, last - first + 1});
      first_key = std::min(first_key, first);
      last_key = std::max(last_key, last);
    }
    if (shadowed && first_key <= last_key) {
      ShadowSequence& part = shadow[static_cast<std::size_t>(s)];
      part.first_block = static_cast<int32_t>(first_key / pool.block_size);
      part.blocks = static_cast<int32_t>(last_key / pool.block_size) - part.first_block + 1;
      plan.shadow_blocks += part.blocks;
    }
  }
  plan.decode_rows = static_cast<int64_t>(decode_rows.size());
  plan.decode_rows_listed = plan.decode_rows > 0 && plan.decode_rows < batch.rows;
  if (plan.decode_rows_listed) plan.work = decode_rows;
  if (plan.decode_rows > 0) {
    plan.splits = choose_splits(plan.decode_rows * pool.num_kv_heads, decode_keys, pool.dtype, group);
    plan.scratch_floats = decode_partials_floats(plan.decode_rows, num_heads, plan.splits);
  }
  // The longest tiles first, so that the short ones fill the last wave.
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.keys > b.keys; });
  plan.prefill_tiles = static_cast<int64_t>(tiles.size());
  for (const Tile& tile : tiles) plan.work.insert(plan.work.end(), {tile.sequence, tile.first_row, tile.rows});
  if (plan.shadow_blocks > 0) {
    plan.shadow_sequences = batch.sequences;
    for (const ShadowSequence& part : shadow) plan.work.insert(plan.work.end(), {part.base, part.first_block, part.blocks});
  }
  return plan;
}

cudaError_t paged_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                            const AttentionPlan& plan, const int32_t* work, float* scratch, const ShadowBuffers& shadow,
                            int32_t num_heads, float scale, int32_t sliding_window, float* out, cudaStream_t stream) {
  if (batch.rows == 0) return cudaSuccess;
  if (pool.head_dim > kMaxAttentionHeadDim || num_heads / pool.num_kv_heads > kMaxAttentionGroup)
    return cudaErrorInvalidValue;
  if (plan.generic)
    return launch_generic_attention(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  const auto decode = [&] {
    return launch_decode_attention(q, pool, slot, batch, plan.decode_rows_listed ? work : nullptr, plan.decode_rows,
                                   plan.splits, scratch, num_heads, scale, sliding_window, out, stream);
  };
  const int32_t* tile_list = work + (plan.decode_rows_listed ? plan.decode_rows : 0);
  if (plan.shadow_blocks == 0) {
    const cudaError_t decoded = decode();
    if (decoded != cudaSuccess) return decoded;
    return launch_prefill_attention(q, pool, slot, batch, tile_list, plan.prefill_tiles, num_heads, scale,
                                    sliding_window, plan.precision, out, stream);
  }
  if (shadow.k == nullptr || shadow.v == nullptr || shadow.block_table == nullptr) return cudaErrorInvalidValue;
  if (pool.scales != nullptr && shadow.scaled_q == nullptr) return cudaErrorInvalidValue;
  if (plan.shadow_blocks > INT32_MAX) return cudaErrorInvalidValue;
  const int32_t* parts = tile_list + 3 * plan.prefill_tiles;
  cudaError_t status = widen_to_shadow(pool, slot, batch, parts, plan.shadow_sequences, plan.shadow_blocks, shadow, stream);
  if (status != cudaSuccess) return status;
  PoolGeometry shadow_pool = pool;
  shadow_pool.k = shadow.k;
  shadow_pool.v = shadow.v;
  shadow_pool.dtype = DType::BF16;
  shadow_pool.scales = nullptr;
  shadow_pool.num_blocks = static_cast<int32_t>(plan.shadow_blocks);
  shadow_pool.slots_per_block = 1;
  BatchGeometry shadow_batch = batch;
  shadow_batch.block_table = shadow.block_table;
  if (pool.scales == nullptr) {
    status = launch_prefill_attention(q, shadow_pool, 0, shadow_batch, tile_list, plan.prefill_tiles, num_heads, scale,
                                      sliding_window, plan.precision, out, stream);
    return status == cudaSuccess ? decode() : status;
  }
  // The shadow holds the codes, not code x scale (BF16 cannot hold those products exactly): the prefill tiles get
  // k_scale through q and v_scale on the output. The whole output is multiplied, so the decode rows, which read the
  // scaled pool themselves, are written after.
  const int64_t values = int64_t{batch.rows} * num_heads * pool.head_dim;
  status = multiply_by_device_scalar(q, shadow.scaled_q, values, pool.scales, stream);
  if (status == cudaSuccess)
    status = launch_prefill_attention(shadow.scaled_q, shadow_pool, 0, shadow_batch, tile_list, plan.prefill_tiles,
                                      num_heads, scale, sliding_window, plan.precision, out, stream);
  if (status == cudaSuccess) status = multiply_by_device_scalar(out, out, values, pool.scales + 1, stream);
  return status == cudaSuccess ? decode() : status;
}

}  // namespace beamline::cuda
