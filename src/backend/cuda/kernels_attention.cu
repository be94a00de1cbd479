// Paged KV writes and paged attention: one kernel for prefill, chunked prefill and decode (varlen rows, causal,
// sliding window, GQA). A block serves one row and one KV head: its warps are the query heads of that group,
// so each K/V tile read from the pool is shared by the whole group; softmax is online (running max and sum).
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace beamline::cuda {
namespace {

constexpr int kKeysPerTile = 32;  // one key per lane when scoring
constexpr int kWriteThreads = 256;

__device__ __forceinline__ int32_t lookup_block(const PoolGeometry& pool, const BatchGeometry& batch, int32_t sequence,
                                                int64_t position) {
  const int64_t index = position / pool.block_size;
  if (index >= batch.table_width) return -1;
  const int32_t block = batch.block_table[int64_t{sequence} * batch.table_width + index];
  return block < pool.num_blocks ? block : -1;
}

__device__ __forceinline__ int64_t pool_offset(const PoolGeometry& pool, int32_t block, int32_t slot, int64_t position,
                                               int32_t kv_head) {
  return ((((int64_t{block} * pool.slots_per_block + slot) * pool.block_size + position % pool.block_size) *
               pool.num_kv_heads +
           kv_head) *
          pool.head_dim);
}

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
  static_cast<P*>(pool.k)[offset] = from_float<P>(k[index]);
  static_cast<P*>(pool.v)[offset] = from_float<P>(v[index]);
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
          k_value = to_float(k_pool[offset]);
          v_value = to_float(v_pool[offset]);
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
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t paged_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                            int32_t num_heads, float scale, int32_t sliding_window, float* out, cudaStream_t stream) {
  if (batch.rows == 0) return cudaSuccess;
  if (pool.head_dim > kMaxAttentionHeadDim || num_heads / pool.num_kv_heads > kMaxAttentionGroup)
    return cudaErrorInvalidValue;
  if (pool.dtype == DType::F32)
    return attention_for_pool<float>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  if (pool.dtype == DType::BF16)
    return attention_for_pool<__nv_bfloat16>(q, pool, slot, batch, num_heads, scale, sliding_window, out, stream);
  return cudaErrorInvalidValue;
}

}  // namespace beamline::cuda
