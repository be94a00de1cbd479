// Split-KV ("flash-decoding") paged attention for rows with few query rows per sequence. A block serves one row,
// one kv head and one of `splits` key ranges: it reads each key and value of its range once for all the query
// heads of the group (GQA), 16 bytes per lane with several keys in flight, F32 math throughout. Each key is
// spread over kLanesPerKey lanes (a "key slot"); a slot keeps its own online softmax (running max and sum), the
// block combines its slots in shared memory, and a second kernel combines the splits (log-sum-exp weights).
// The score sums are reduce-scattered over the slot's lanes and shared back through shared memory, so shuffles
// and exponentials are not repeated on every lane: the key loop stays below the HBM rate in instructions.
#include <cmath>

#include "backend/cuda/attention_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kKeysInFlight = 4;  // keys per key slot loaded before the first is used
constexpr int kMergeThreads = 128;

template <typename P>
struct DecodeShape {
  static constexpr int kValuesPerLoad = 16 / static_cast<int>(sizeof(P));
  static constexpr int kLanesPerKey = kFastHeadDim / kValuesPerLoad;  // 16 (BF16) or 32 (F32)
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
    uint4 k_raw[kKeysInFlight], v_raw[kKeysInFlight];
    unsigned int valid = 0;  // bit c: key c of this step is visible and present
#pragma unroll
    for (int c = 0; c < kKeysInFlight; ++c) {
      k_raw[c] = v_raw[c] = uint4{0, 0, 0, 0};
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

// out = Σ_s w_s acc_s / Σ_s w_s sum_s with w_s = exp(max_s − max): the softmax over all splits' keys.
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const int32_t* rows, int64_t count,
                                                                     int32_t splits, const float* partials,
                                                                     int32_t num_heads, float* out) {
  const int64_t item = blockIdx.x;
  const int64_t row = rows != nullptr ? rows[item] : item;
  const int32_t head = blockIdx.y;
  const float* stats = partials + stats_offset(count, num_heads, splits);
  const int64_t first_split = (item * num_heads + head) * splits;
  float total_max = -INFINITY;
  bool poisoned = false;
  for (int s = 0; s < splits; ++s) {
    total_max = fmaxf(total_max, stats[2 * (first_split + s)]);
    poisoned |= isnan(stats[2 * (first_split + s) + 1]);
  }
  for (int d = threadIdx.x; d < kFastHeadDim; d += kMergeThreads) {
    float sum = 0.0f, value = 0.0f;
    if (total_max != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float split_max = stats[2 * (first_split + s)];
        const float weight = split_max == -INFINITY ? 0.0f : expf(split_max - total_max);
        sum += weight * stats[2 * (first_split + s) + 1];
        value += weight * partials[(first_split + s) * kFastHeadDim + d];
      }
    }
    out[(row * num_heads + head) * kFastHeadDim + d] = poisoned ? quiet_nan() : (sum > 0.0f ? value / sum : 0.0f);
  }
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
  const dim3 merge_grid(static_cast<unsigned int>(count), static_cast<unsigned int>(num_heads));
  merge_splits_kernel<<<merge_grid, kMergeThreads, 0, stream>>>(rows, count, splits, partials, num_heads, out);
  return cudaGetLastError();
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

// Calls body.template run<P, kGroup>() for the pool dtype and the group rounded up to 4, 6 or 8 (heads past the
// group are computed on zeros and never stored; small groups are not Beam-1.0's and stay correct, not fast).
template <typename P, typename Body>
cudaError_t dispatch_group(int32_t group, const Body& body) {
  if (group <= 4) return body.template run<P, 4>();
  if (group <= 6) return body.template run<P, 6>();
  return body.template run<P, 8>();
}

template <typename Body>
cudaError_t dispatch_decode(DType dtype, int32_t group, const Body& body) {
  if (dtype == DType::F32) return dispatch_group<float>(group, body);
  if (dtype == DType::BF16) return dispatch_group<__nv_bfloat16>(group, body);
  return cudaErrorInvalidValue;
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
  return dispatch_decode(pool.dtype, num_heads / pool.num_kv_heads,
                         DecodeLaunch{q, pool, slot, batch, rows, count, splits, partials, num_heads, scale,
                                      sliding_window, out, stream});
}

int decode_blocks_per_multiprocessor(DType dtype, int32_t group) {
  int blocks = 1;
  dispatch_decode(dtype, group, OccupancyQuery{&blocks});
  return blocks;
}

int64_t decode_partials_floats(int64_t count, int32_t num_heads, int32_t splits) {
  return splits == 1 ? 0 : count * num_heads * splits * (kFastHeadDim + 2);
}

}  // namespace beamline::cuda
