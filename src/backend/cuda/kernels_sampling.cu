// Backend::sample on the device: one block per row, FP32, no sort of the vocabulary. top_k and top_p find their
// cut by bisection over the order-preserving bits of the logits (by count for top_k, by probability mass for
// top_p; block reductions, no atomics); the draw is an ordered block scan in token-id order that stops at the
// tile holding the uniform's token. The reference is backend/sampling.h's sample_row.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace beamline::cuda {
namespace {

constexpr int kSampleThreads = 512;
constexpr int kScanItems = 4;  // consecutive tokens per thread in a scan tile

// NaN counts as -inf; -0 becomes +0 so that equal floats have equal keys.
__device__ __forceinline__ float clean(float v) {
  if (isnan(v)) return -INFINITY;
  return v == 0.0f ? 0.0f : v;
}

// Unsigned keys in the order of the floats (-inf lowest).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

struct Candidate {
  float value;
  int32_t id;
};
// Higher value, then lower id (the CPU's rank order).
__device__ __forceinline__ bool ranks_before(float value, int32_t id, const Candidate& other) {
  return value > other.value || (value == other.value && id < other.id);
}
struct BetterCandidate {
  __device__ Candidate operator()(const Candidate& a, const Candidate& b) const {
    return ranks_before(a.value, a.id, b) ? a : b;
  }
};
struct Maximum {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

// Reduction over the block; every thread gets the result.
template <typename T, typename Op>
__device__ T block_reduce(T value, Op op) {
  using Reduce = cub::BlockReduce<T, kSampleThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ T result;
  const T reduced = Reduce(storage).Reduce(value, op);
  if (threadIdx.x == 0) result = reduced;
  __syncthreads();
  const T out = result;
  __syncthreads();
  return out;
}

// The best-ranked token among those `eligible(id, value)` admits; {-inf, INT_MAX} when none.
template <typename Value, typename Eligible>
__device__ Candidate block_best(int64_t vocab, Value value_of, Eligible eligible) {
  Candidate best{-INFINITY, INT_MAX};
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = value_of(i);
    const auto id = static_cast<int32_t>(i);
    if (eligible(id, v) && ranks_before(v, id, best)) best = Candidate{v, id};
  }
  return block_reduce(best, BetterCandidate{});
}

// The highest key K whose measure, the block sum of quantity(i) over the tokens with key(i) >= K, reaches
// `target`, by bisection over the 32 key bits: one pass over the row per bit, no atomics, and a fixed summation
// order, so the measure is monotonic in K and the result deterministic. Needs measure(low) >= target and
// measure(high) < target; the result is the key of a token. `entry(i, key, quantity)` describes token i.
template <typename T, typename Entry>
__device__ uint32_t highest_key_reaching(int64_t vocab, T target, uint32_t low, uint32_t high, Entry entry) {
  while (high - low > 1) {
    const uint32_t middle = low + (high - low) / 2;
    T local = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      uint32_t key;
      T quantity;
      entry(i, key, quantity);
      if (key >= middle) local += quantity;
    }
    if (block_reduce(local, Sum{}) >= target) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

struct ScanPart {
  float mass;    // of kept tokens that are not boundary ties
  int32_t ties;  // boundary ties (all of weight `tie_weight`; the first `kept_ties` of them in id order are kept)
};
struct AddParts {
  __device__ ScanPart operator()(const ScanPart& a, const ScanPart& b) const {
    return ScanPart{a.mass + b.mass, a.ties + b.ties};
  }
};

__device__ int32_t draw(const float* x, int64_t vocab, const SampleRowParams& p) {
  const float temperature = p.temperature;
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) local_max = fmaxf(local_max, clean(x[i]));
  // Division by a positive temperature is monotonic, so this is the maximum of the scaled row.
  const float best = block_reduce(local_max, Maximum{}) / temperature;
  if (best == -INFINITY) return 0;
  const float threshold = p.min_p > 0.0f ? best + logf(p.min_p) : -INFINITY;
  auto filtered = [&](int64_t i) {
    const float s = clean(x[i]) / temperature;
    return s >= threshold ? s : -INFINITY;
  };
  float kth = -INFINITY;
  if (p.top_k > 0 && p.top_k < vocab) {
    // Every token counts at key(-inf) or above (vocab >= top_k), none above the best.
    kth = key_value(highest_key_reaching(vocab, p.top_k, order_key(-INFINITY), order_key(best) + 1,
                                         [&](int64_t i, uint32_t& key, int32_t& quantity) {
                                           key = order_key(filtered(i));
                                           quantity = 1;
                                         }));
  }
  auto kept = [&](int64_t i) {
    const float s = filtered(i);
    return s >= kth ? s : -INFINITY;
  };
  auto weight_of = [&](float v) { return v == -INFINITY ? 0.0f : expf(v - best); };

  auto kept_entry = [&](int64_t i, uint32_t& key, float& weight) {
    const float v = kept(i);
    key = order_key(v);
    weight = weight_of(v);
  };
  // The kept mass, summed as highest_key_reaching sums it (every kept key is above key(-inf)).
  float local_total = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    uint32_t key;
    float weight;
    kept_entry(i, key, weight);
    local_total += weight;
  }
  float total = block_reduce(local_total, Sum{});

  const bool nucleus = p.top_p < 1.0f;
  uint32_t boundary = 0;  // with no nucleus every finite kept token is above it
  float tie_weight = 0.0f;
  int32_t kept_ties = 0;
  if (nucleus) {
    // The nucleus edge: the key at which the mass of the keys at or above it first reaches top_p of the total.
    const float target = p.top_p * total;
    boundary = highest_key_reaching(vocab, target, order_key(-INFINITY), order_key(best) + 1, kept_entry);
    float local_above = 0.0f;
    int32_t local_ties = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      uint32_t key;
      float weight;
      kept_entry(i, key, weight);
      if (key > boundary) local_above += weight;
      local_ties += key == boundary;
    }
    const float above = block_reduce(local_above, Sum{});
    const int32_t ties = block_reduce(local_ties, Sum{});
    // Of the tokens tied at the edge, the lower ids first, as many as the target needs.
    tie_weight = weight_of(key_value(boundary));
    kept_ties = max(1, min(ties, static_cast<int32_t>(ceilf((target - above) / tie_weight))));
    total = above + static_cast<float>(kept_ties) * tie_weight;
  }

  const auto draw_target = static_cast<float>(p.uniform * static_cast<double>(total));
  using Scan = cub::BlockScan<ScanPart, kSampleThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t found, last_kept;
  if (threadIdx.x == 0) {
    found = INT_MAX;
    last_kept = -1;
  }
  __syncthreads();
  ScanPart running{0.0f, 0};
  constexpr int64_t kTile = int64_t{kSampleThreads} * kScanItems;
  for (int64_t tile = 0; tile < vocab; tile += kTile) {
    float weight[kScanItems];
    bool is_tie[kScanItems], is_kept[kScanItems];
    ScanPart local{0.0f, 0};
    const int64_t first = tile + int64_t{threadIdx.x} * kScanItems;
    for (int j = 0; j < kScanItems; ++j) {
      const int64_t i = first + j;
      const float v = i < vocab ? kept(i) : -INFINITY;
      const uint32_t key = order_key(v);
      is_kept[j] = v != -INFINITY && key >= boundary;
      is_tie[j] = is_kept[j] && nucleus && key == boundary;
      weight[j] = is_kept[j] ? weight_of(v) : 0.0f;
      if (is_tie[j]) {
        ++local.ties;
      } else {
        local.mass += weight[j];
      }
    }
    ScanPart before, aggregate;
    Scan(scan_storage).ExclusiveScan(local, before, ScanPart{0.0f, 0}, AddParts{}, aggregate);
    int32_t ties_before = running.ties + before.ties;
    float cumulative = running.mass + before.mass + static_cast<float>(min(ties_before, kept_ties)) * tie_weight;
    int32_t last = -1;
    for (int j = 0; j < kScanItems; ++j) {
      if (!is_kept[j]) continue;
      if (is_tie[j] && ties_before++ >= kept_ties) continue;
      cumulative += weight[j];
      last = static_cast<int32_t>(first + j);
      if (cumulative > draw_target) {
        atomicMin(&found, last);
        break;
      }
    }
    if (last >= 0) atomicMax(&last_kept, last);
    running = AddParts{}(running, aggregate);
    __syncthreads();
    if (found != INT_MAX) break;
  }
  const int32_t token = found != INT_MAX ? found : max(last_kept, 0);  // rounding left the target above the sum
  __syncthreads();
  return token;
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* logits, int64_t vocab, const SampleRowParams* rows, int32_t* tokens, float* logprobs,
                  int32_t* ranks, int32_t* top_ids, float* top_logprobs, int32_t top_width) {
  const SampleRowParams p = rows[blockIdx.x];
  const float* x = logits + int64_t{p.logit_row} * vocab;
  auto raw = [&](int64_t i) { return clean(x[i]); };
  int32_t token;
  if (p.greedy) {
    token = block_best(vocab, raw, [](int32_t, float) { return true; }).id;
    if (token == INT_MAX) token = 0;
  } else {
    token = draw(x, vocab, p);
  }
  if (threadIdx.x == 0) tokens[blockIdx.x] = token;
  if (p.num_logprobs < 0) return;

  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) local_max = fmaxf(local_max, raw(i));
  const float raw_max = block_reduce(local_max, Maximum{});
  float local_sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) local_sum += expf(raw(i) - raw_max);
  const float log_total = raw_max + logf(block_reduce(local_sum, Sum{}));
  const float token_value = raw(token);
  int32_t local_higher = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) local_higher += raw(i) > token_value;
  const int32_t higher = block_reduce(local_higher, Sum{});
  if (threadIdx.x == 0) {
    logprobs[blockIdx.x] = token_value - log_total;
    ranks[blockIdx.x] = 1 + higher;
  }
  // The best n one at a time: each pass takes the best token ranked after the previous one.
  Candidate previous{INFINITY, -1};
  for (int32_t j = 0; j < p.num_logprobs; ++j) {
    previous = block_best(vocab, raw, [&](int32_t id, float v) {
      return v < previous.value || (v == previous.value && id > previous.id);
    });
    if (threadIdx.x == 0) {
      top_ids[int64_t{blockIdx.x} * top_width + j] = previous.id;
      top_logprobs[int64_t{blockIdx.x} * top_width + j] = previous.value - log_total;
    }
  }
}

}  // namespace

cudaError_t sample(const float* logits, int64_t vocab, const SampleRowParams* rows, int32_t count, int32_t* tokens,
                   float* logprobs, int32_t* ranks, int32_t* top_ids, float* top_logprobs, int32_t top_width,
                   cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  sample_kernel<<<static_cast<unsigned int>(count), kSampleThreads, 0, stream>>>(
      logits, vocab, rows, tokens, logprobs, ranks, top_ids, top_logprobs, top_width);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
