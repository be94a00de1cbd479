// Tiled paged attention for prefill and chunked prefill on the CUDA cores, for F32 KV pools (BF16 pools take the
// tensor-core kernels, attention/prefill_wgmma.cu and attention/prefill_mma.cu). A block serves
// one tile of consecutive query rows of one sequence and one kv head: its kVectors query vectors are (row, head of
// the group) pairs, so every K/V tile staged in shared memory is reused by all rows and all heads of the group.
// Key tiles outside the union of the vectors' visible ranges (causal, sliding window) are never read; masks
// inside a tile are exact. F32 math on the CUDA cores: each thread owns a 6 x 4 block of scores and a 6 x 8 block
// of the output, online softmax per vector, and the next K/V tile is loaded into registers while the current one
// is used.
#include <climits>
#include <cmath>

#include "backend/cuda/attention/attention_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVectors = 96;  // query vectors (row, head) per block
constexpr int kKeys = 64;     // keys per tile
constexpr int kDim = kFastHeadDim;
constexpr int kVectorsPerThread = kVectors / 16;
constexpr int kKeysPerThread = kKeys / 16;
constexpr int kDimGroups = kDim / 64;  // float4 columns of the output per thread, 64 floats apart
constexpr int kRowStride = kDim + 4;   // q and K rows, padded so 16 lanes reading 16 rows hit distinct banks
constexpr int kScoreStride = kKeys + 4;
constexpr int kQueryFloats = kVectors * kRowStride;
constexpr int kKeyFloats = kKeys * kRowStride;  // the probabilities P [kVectors][kScoreStride] reuse this space
constexpr int kValueFloats = kKeys * kDim;
static_assert(kVectors * kScoreStride <= kKeyFloats, "P must fit in the K tile's space");
constexpr size_t kSharedBytes = sizeof(float) * (kQueryFloats + kKeyFloats + kValueFloats);

template <typename P>
struct TileLoad {
  static constexpr int kValuesPerLoad = 16 / static_cast<int>(sizeof(P));
  static constexpr int kLoadsPerKey = kDim / kValuesPerLoad;
  static constexpr int kLoadsPerThread = kKeys * kLoadsPerKey / kThreads;
};

template <typename P>
__device__ __forceinline__ void store_floats(float* destination, const uint4& raw) {
  float values[TileLoad<P>::kValuesPerLoad];
  unpack(raw, values);
#pragma unroll
  for (int j = 0; j < TileLoad<P>::kValuesPerLoad; j += 4)
    *reinterpret_cast<float4*>(destination + j) = make_float4(values[j], values[j + 1], values[j + 2], values[j + 3]);
}

template <typename P>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_kernel(const float* q, PoolGeometry pool, int32_t slot, BatchGeometry batch,
                             const int32_t* tile_list, int32_t num_heads, float scale, int32_t sliding_window,
                             float* out) {
  using Load = TileLoad<P>;
  extern __shared__ float4 shared_words[];
  float* q_tile = reinterpret_cast<float*>(shared_words);
  float* k_tile = q_tile + kQueryFloats;
  float* p_tile = k_tile;
  float* v_tile = k_tile + kKeyFloats;
  __shared__ int key_missing[kKeys];
  __shared__ int range_first, range_last;

  const int32_t sequence = tile_list[3 * blockIdx.x], first_row = tile_list[3 * blockIdx.x + 1];
  const int32_t tile_rows = tile_list[3 * blockIdx.x + 2];
  const int32_t kv_head = blockIdx.y, group = num_heads / pool.num_kv_heads;
  const int32_t vectors = tile_rows * group;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
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
    *reinterpret_cast<float4*>(q_tile + vector * kRowStride + d) = value;
  }
  __syncthreads();

  // The visible keys [lowest, highest] of each of this thread's vectors (empty for padding vectors).
  int32_t lowest[kVectorsPerThread], highest[kVectorsPerThread];
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int vector = ty + 16 * i;
    lowest[i] = 1;
    highest[i] = 0;
    if (vector < vectors) {
      const int64_t position = batch.positions[first_row + vector / group];
      lowest[i] = sliding_window > 0 ? static_cast<int32_t>(max(int64_t{0}, position - sliding_window + 1)) : 0;
      highest[i] = static_cast<int32_t>(min(position, seq_len - 1));
      if (tx == 0 && lowest[i] <= highest[i]) {
        atomicMin(&range_first, lowest[i]);
        atomicMax(&range_last, highest[i]);
      }
    }
  }
  __syncthreads();
  const int32_t first_key = range_first, last_key = range_last;

  float running_max[kVectorsPerThread], running_sum[kVectorsPerThread], acc[kVectorsPerThread][4 * kDimGroups];
  bool poisoned[kVectorsPerThread];
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    running_max[i] = -INFINITY;
    running_sum[i] = 0.0f;
    poisoned[i] = false;
#pragma unroll
    for (int j = 0; j < 4 * kDimGroups; ++j) acc[i][j] = 0.0f;
  }

  const P* k_pool = static_cast<const P*>(pool.k);
  const P* v_pool = static_cast<const P*>(pool.v);
  const KeyRows key_rows_of_sequence = key_rows(pool, batch, sequence, slot, kv_head);
  uint4 k_next[Load::kLoadsPerThread], v_next[Load::kLoadsPerThread];
  bool next_missing[Load::kLoadsPerThread];
  auto fetch = [&](int32_t tile_start) {
#pragma unroll
    for (int i = 0; i < Load::kLoadsPerThread; ++i) {
      const int chunk = threadIdx.x + kThreads * i;
      const int key = chunk / Load::kLoadsPerKey, part = chunk % Load::kLoadsPerKey;
      const int32_t t = tile_start + key;
      k_next[i] = v_next[i] = uint4{0, 0, 0, 0};
      next_missing[i] = false;
      if (t <= last_key) {
        const int32_t block = key_rows_of_sequence.block_of(t);
        if (block < 0) {
          next_missing[i] = true;
        } else {
          const int64_t offset = key_rows_of_sequence.offset(block, t) + part * Load::kValuesPerLoad;
          k_next[i] = __ldg(reinterpret_cast<const uint4*>(k_pool + offset));
          v_next[i] = __ldg(reinterpret_cast<const uint4*>(v_pool + offset));
        }
      }
    }
  };
  if (first_key <= last_key) fetch(first_key);

  for (int32_t tile_start = first_key; tile_start <= last_key; tile_start += kKeys) {
    __syncthreads();  // the previous tile's P and V are consumed
#pragma unroll
    for (int i = 0; i < Load::kLoadsPerThread; ++i) {
      const int chunk = threadIdx.x + kThreads * i;
      const int key = chunk / Load::kLoadsPerKey, d = chunk % Load::kLoadsPerKey * Load::kValuesPerLoad;
      store_floats<P>(k_tile + key * kRowStride + d, k_next[i]);
      store_floats<P>(v_tile + key * kDim + d, v_next[i]);
      if (d == 0) key_missing[key] = next_missing[i];
    }
    __syncthreads();
    if (tile_start + kKeys <= last_key) fetch(tile_start + kKeys);

    float score[kVectorsPerThread][kKeysPerThread];
#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) score[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < kDim; d += 4) {
      float4 key[kKeysPerThread];
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j)
        key[j] = *reinterpret_cast<const float4*>(k_tile + (tx + 16 * j) * kRowStride + d);
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const float4 query = *reinterpret_cast<const float4*>(q_tile + (ty + 16 * i) * kRowStride + d);
#pragma unroll
        for (int j = 0; j < kKeysPerThread; ++j) {
          score[i][j] = fmaf(query.x, key[j].x, score[i][j]);
          score[i][j] = fmaf(query.y, key[j].y, score[i][j]);
          score[i][j] = fmaf(query.z, key[j].z, score[i][j]);
          score[i][j] = fmaf(query.w, key[j].w, score[i][j]);
        }
      }
    }
    __syncthreads();  // K is consumed: P takes its place

#pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        const int32_t t = tile_start + tx + 16 * j;
        const bool visible = t >= lowest[i] && t <= highest[i];
        poisoned[i] |= visible && key_missing[tx + 16 * j] != 0;
        score[i][j] = visible ? scale * score[i][j] : -INFINITY;
        tile_max = fmaxf(tile_max, score[i][j]);
      }
#pragma unroll
      for (int offset = 8; offset > 0; offset >>= 1)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      const float new_max = fmaxf(running_max[i], tile_max);
      float tile_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        const float p = score[i][j] == -INFINITY ? 0.0f : expf(score[i][j] - new_max);
        tile_sum += p;
        p_tile[(ty + 16 * i) * kScoreStride + tx + 16 * j] = p;
      }
#pragma unroll
      for (int offset = 8; offset > 0; offset >>= 1) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
      const float correction = running_max[i] == new_max ? 1.0f : expf(running_max[i] - new_max);
      running_sum[i] = running_sum[i] * correction + tile_sum;
      running_max[i] = new_max;
#pragma unroll
      for (int j = 0; j < 4 * kDimGroups; ++j) acc[i][j] *= correction;
    }
    __syncthreads();

#pragma unroll 2
    for (int key = 0; key < kKeys; key += 4) {
      float4 probability[kVectorsPerThread];
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i)
        probability[i] = *reinterpret_cast<const float4*>(p_tile + (ty + 16 * i) * kScoreStride + key);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
#pragma unroll
        for (int g = 0; g < kDimGroups; ++g) {
          const float4 value = *reinterpret_cast<const float4*>(v_tile + (key + k) * kDim + g * 64 + tx * 4);
#pragma unroll
          for (int i = 0; i < kVectorsPerThread; ++i) {
            const float p = k == 0 ? probability[i].x : k == 1 ? probability[i].y : k == 2 ? probability[i].z
                                                                                              : probability[i].w;
            acc[i][4 * g] = fmaf(p, value.x, acc[i][4 * g]);
            acc[i][4 * g + 1] = fmaf(p, value.y, acc[i][4 * g + 1]);
            acc[i][4 * g + 2] = fmaf(p, value.z, acc[i][4 * g + 2]);
            acc[i][4 * g + 3] = fmaf(p, value.w, acc[i][4 * g + 3]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int vector = ty + 16 * i;
    int poison = poisoned[i];
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1) poison |= __shfl_xor_sync(0xffffffffu, poison, offset);
    if (vector >= vectors) continue;
    const int64_t row = first_row + vector / group;
    const int32_t head = kv_head * group + vector % group;
    const float inverse = running_sum[i] > 0.0f ? 1.0f / running_sum[i] : 0.0f;
#pragma unroll
    for (int g = 0; g < kDimGroups; ++g) {
      float4 result = make_float4(acc[i][4 * g] * inverse, acc[i][4 * g + 1] * inverse, acc[i][4 * g + 2] * inverse,
                                  acc[i][4 * g + 3] * inverse);
      if (poison) result = make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan());
      *reinterpret_cast<float4*>(out + (row * num_heads + head) * kDim + g * 64 + tx * 4) = result;
    }
  }
}

template <typename P>
cudaError_t launch_prefill(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                           const int32_t* tile_list, int64_t tiles, int32_t num_heads, float scale,
                           int32_t sliding_window, float* out, cudaStream_t stream) {
  auto kernel = prefill_attention_kernel<P>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedBytes));
  if (configured != cudaSuccess) return configured;
  const dim3 grid(static_cast<unsigned int>(tiles), static_cast<unsigned int>(pool.num_kv_heads));
  kernel<<<grid, kThreads, kSharedBytes, stream>>>(q, pool, slot, batch, tile_list, num_heads, scale, sliding_window,
                                                   out);
  return cudaGetLastError();
}

}  // namespace

int32_t prefill_rows_per_tile(int32_t group, DType dtype) {
  return dtype == DType::BF16 ? prefill_mma_rows_per_tile(group) : kVectors / group;
}

cudaError_t launch_prefill_attention(const float* q, const PoolGeometry& pool, int32_t slot,
                                     const BatchGeometry& batch, const int32_t* tile_list, int64_t tiles,
                                     int32_t num_heads, float scale, int32_t sliding_window,
                                     OperandPrecision precision, float* out, cudaStream_t stream) {
  if (tiles == 0) return cudaSuccess;
  if (pool.dtype == DType::F32)
    return launch_prefill<float>(q, pool, slot, batch, tile_list, tiles, num_heads, scale, sliding_window, out,
                                 stream);
  if (pool.dtype == DType::BF16 && precision == OperandPrecision::Bf16)
    return launch_prefill_attention_wgmma(q, pool, slot, batch, tile_list, tiles, num_heads, scale, sliding_window,
                                          out, stream);
  if (pool.dtype == DType::BF16)
    return launch_prefill_attention_mma(q, pool, slot, batch, tile_list, tiles, num_heads, scale, sliding_window,
                                        out, stream);
  return cudaErrorInvalidValue;
}

}  // namespace beamline::cuda
