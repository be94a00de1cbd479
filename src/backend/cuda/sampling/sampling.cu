// Backend::sample on the device: one block of 1024 threads per row, or with few rows a thread-block cluster of up to
// eight (the row's parts, so that few rows still spread over the GPU), FP32, no sort of the vocabulary. The
// reference is sampling/sampling.h's sample_row.
//
// Every pass reads the row with coalesced 16-byte loads (a warp covers 128 consecutive tokens per load), the row
// staying in L2 between passes. top_k (by count) and top_p (by probability mass) find their cut in two steps:
//  1. one pass sorts the tokens into 16 levels by their distance from the row's maximum (half-octaves of
//     max - value, from the float bits), each thread counting into a private column of shared memory, so that
//     a hot level costs no atomics and no contention; the level holding the cut follows from the merged counts;
//  2. the values of that level (a few hundred on LM logits) are gathered into shared memory, and the cut is the
//     bisection over their order-preserving keys, with block reductions over shared memory only. For top_k every
//     level up to the cut is gathered when it fits, so that top_p then works on the kept set in shared memory. A
//     level too large to gather (flat or heavily tied rows) is searched in the row instead: one key when the
//     level holds a single value, a bisection over the level's key range otherwise.
// The draw is one pass that writes the kept mass of each 128-token segment, a block scan (in double, as the CPU
// sums) over the segments in token-id order, and one warp that scans the segment holding the uniform's token.
// The logprobs are a second kernel: the top ones come from the levels of the raw row the same way (the best
// levels that hold them, gathered, then picked one by one).
// A row split over a cluster: each pass divides the row's loads among its blocks; what a pass reduces (the maximum,
// level histograms, key ranges, bisection sums) is combined over the cluster through distributed shared memory in
// rank order, so every block gets the same bits; gathered values are collected in the first block, which selects
// among them and broadcasts the result; the draw's segment masses are written into the first block, which scans.
#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <array>
#include <climits>
#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/sampling/sampling.h"

namespace beamline::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kSampleThreads = 1024;
constexpr int kUnroll = 3;                       // quads (16-byte loads) in flight per thread and pass
constexpr int kLevels = 16;                      // distance levels of the first step
constexpr int kLevelBase = (0x3F000000 >> 22) - 1;  // distance 0.5 (bits 0x3F000000) starts level 1
constexpr int kSegmentTokens = 128;              // one warp-wide load
constexpr int kWorkspaceBytes = 2 * kLevels * kSampleThreads * 4;  // the private level columns: 128 KiB
constexpr int kValueCapacity = kWorkspaceBytes / 4;    // gathered values
constexpr int kPairCapacity = kWorkspaceBytes / 8;     // gathered (value, id) pairs for the top logprobs
constexpr int kSegmentCapacity = kWorkspaceBytes / 12;  // segments of the draw (a double mass and a tie count each)
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxRowParts = 8;  // blocks of a row's cluster (the portable cluster size)

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

// The level of a finite value s <= top: 0 below distance 0.5, then half-octaves of top - s up to 15 (distance
// 64 and beyond). Rounding of the subtraction is monotonic, so a lower level always means a higher value, and
// equal values share a level.
__device__ __forceinline__ int level_of(float top, float s) {
  const int level = static_cast<int>(__float_as_uint(top - s) >> 22) - kLevelBase;
  return min(max(level, 0), kLevels - 1);
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
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct Minimum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
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

// Sum over the block with one barrier, for loops of dependent reductions such as a bisection: call i of a loop
// passes step = i, so that consecutive calls use different halves of `partial` (a warp still reading call i's
// while another writes call i + 1's); every warp sums the 32 warp totals in the same order.
template <typename T>
__device__ T block_sum_step(T value, int step) {
  __shared__ T partial[2][kSampleThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(kFullMask, value, offset);
  if (threadIdx.x % 32 == 0) partial[step & 1][threadIdx.x / 32] = value;
  __syncthreads();
  T total = partial[step & 1][threadIdx.x % 32];
  for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(kFullMask, total, offset);
  return total;
}

__device__ __forceinline__ int32_t warp_sum_int(int32_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ double warp_sum_double(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_exclusive_sum(T v) {
  const int lane = threadIdx.x % 32;
  T inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  const T exclusive = __shfl_up_sync(kFullMask, inclusive, 1);
  return lane == 0 ? T{0} : exclusive;
}

// Exclusive prefix sum over the block in thread order, and the block's total (cub's BlockScan of doubles needs
// more than the 64 registers a thread has here).
__device__ double block_exclusive_sum(double v, double& total) {
  __shared__ double warp_before[kSampleThreads / 32];
  __shared__ double block_total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const double in_warp = warp_exclusive_sum(v);
  if (lane == 31) warp_before[warp] = in_warp + v;
  __syncthreads();
  if (warp == 0) {
    const double warp_total = warp_before[lane];
    const double before = warp_exclusive_sum(warp_total);
    if (lane == 31) block_total = before + warp_total;
    warp_before[lane] = before;
  }
  __syncthreads();
  total = block_total;
  const double result = warp_before[warp] + in_warp;
  __syncthreads();  // before a later call reuses the arrays
  return result;
}

extern __shared__ __align__(16) unsigned char workspace[];

// ---- a row over a cluster ----
__device__ __forceinline__ int row_parts() { return static_cast<int>(cg::this_cluster().num_blocks()); }
__device__ __forceinline__ int row_part() { return static_cast<int>(cg::this_cluster().block_rank()); }
__device__ __forceinline__ void sync_row() { cg::this_cluster().sync(); }

// One value per block for across_row, in two slots used in turn: a block may write its next value while another
// still reads its previous one (it cannot get two exchanges ahead: each waits for every block at the barrier).
__shared__ __align__(16) unsigned char exchange_slot[2][16];
__shared__ int exchange_turn;

// combine(...(combine(v0, v1), ...), v_last) over every block's `block_value` (thread 0's), in rank order.
template <typename T, typename Combine>
__device__ T across_row(T block_value, Combine combine) {
  static_assert(sizeof(T) <= sizeof(exchange_slot[0]), "an exchanged value fits a slot");
  __shared__ T combined;
  auto cluster = cg::this_cluster();
  const int turn = exchange_turn;
  T* slot = reinterpret_cast<T*>(exchange_slot[turn]);
  if (threadIdx.x == 0) *slot = block_value;
  cluster.sync();
  if (threadIdx.x == 0) {
    T result = *cluster.map_shared_rank(slot, 0);
    for (unsigned r = 1; r < cluster.num_blocks(); ++r) result = combine(result, *cluster.map_shared_rank(slot, r));
    combined = result;
    exchange_turn = turn ^ 1;
  }
  __syncthreads();
  return combined;
}

// Reduction over the row's blocks; every thread of every block gets the same result.
template <typename T, typename Op>
__device__ T row_reduce(T value, Op op) {
  const T block = block_reduce(value, op);
  return row_parts() == 1 ? block : across_row(block, op);
}

// The first block's `value` in every block.
template <typename T>
__device__ T from_first_block(T value) {
  return row_parts() == 1 ? value : across_row(value, [](T first, T) { return first; });
}

// Reduction over the row's blocks when the values are spread over them, else over this block alone.
template <typename T, typename Op>
__device__ T reduce_over(bool row_wide, T value, Op op) {
  return row_wide ? row_reduce(value, op) : block_reduce(value, op);
}

// Appends the items each other block gathered (`*filled` of them at the start of its workspace) to the first
// block's, after its own, in rank order.
template <typename T>
__device__ void collect_at_first(int32_t* filled) {
  auto cluster = cg::this_cluster();
  if (cluster.num_blocks() == 1) return;
  cluster.sync();  // every block's items are written
  if (cluster.block_rank() == 0) {
    T* items = reinterpret_cast<T*>(workspace);
    int32_t total = *filled;
    for (unsigned r = 1; r < cluster.num_blocks(); ++r) {
      const int32_t count = *cluster.map_shared_rank(filled, r);
      const T* remote = cluster.map_shared_rank(items, r);
      for (int32_t i = threadIdx.x; i < count; i += kSampleThreads) items[total + i] = remote[i];
      total += count;
    }
  }
  cluster.sync();  // the first block has copied: the others may reuse their workspaces
}

struct Row {
  const float* x;
  int64_t vocab;
  bool aligned;  // 16-byte loads possible
};

// Tokens 4q..4q+3, cleaned; -inf past the end of the row.
__device__ __forceinline__ float4 load_quad(const Row& row, int64_t quad) {
  const int64_t first = quad * 4;
  float4 v;
  if (row.aligned && first + 4 <= row.vocab) {
    v = __ldg(reinterpret_cast<const float4*>(row.x) + quad);
  } else {
    v.x = first < row.vocab ? __ldg(row.x + first) : -INFINITY;
    v.y = first + 1 < row.vocab ? __ldg(row.x + first + 1) : -INFINITY;
    v.z = first + 2 < row.vocab ? __ldg(row.x + first + 2) : -INFINITY;
    v.w = first + 3 < row.vocab ? __ldg(row.x + first + 3) : -INFINITY;
  }
  return float4{clean(v.x), clean(v.y), clean(v.z), clean(v.w)};
}

// visit(quad, values) for this block's quads of the row (its part: a run of whole passes of the block), padded
// with -inf to whole passes: the calls are the same for every thread of a warp (warp collectives may be used
// inside), and the 32 lanes of a warp visit the 32 quads of one segment together.
template <typename Visit>
__device__ void for_each_quad(const Row& row, Visit visit) {
  constexpr int64_t kPassQuads = int64_t{kUnroll} * kSampleThreads;
  const int64_t quads = (row.vocab + 3) / 4;
  const int parts = row_parts();
  const int64_t part_quads = (quads + kPassQuads * parts - 1) / (kPassQuads * parts) * kPassQuads;
  const int64_t begin = row_part() * part_quads, end = min(quads, begin + part_quads);
  for (int64_t base = begin; base < end; base += kPassQuads) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_quad(row, base + u * kSampleThreads + threadIdx.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) visit(base + u * kSampleThreads + threadIdx.x, v[u]);
  }
}

// visit(id, value) for this block's tokens (and the -inf padding past the end, with ids past the end).
template <typename Visit>
__device__ void for_each_token(const Row& row, Visit visit) {
  for_each_quad(row, [&](int64_t quad, const float4& v) {
    const auto id = static_cast<int32_t>(quad * 4);
    visit(id, v.x);
    visit(id + 1, v.y);
    visit(id + 2, v.z);
    visit(id + 3, v.w);
  });
}

struct Levels {
  int32_t count[kLevels];
  float mass[kLevels];  // of exp(s - top); only when asked
};

// Counts (and with `with_mass`, the mass of) the finite values value_of(raw) per level over the row, into `levels`
// (shared, the same in every block of the row).
template <typename ValueOf>
__device__ void level_histogram(const Row& row, float top, bool with_mass, ValueOf value_of, Levels& levels) {
  auto* counts = reinterpret_cast<int32_t*>(workspace);
  auto* masses = reinterpret_cast<float*>(workspace) + kLevels * kSampleThreads;
  const int tid = threadIdx.x;
  __syncthreads();  // the workspace's previous use is over
  for (int l = 0; l < kLevels; ++l) {
    counts[l * kSampleThreads + tid] = 0;
    masses[l * kSampleThreads + tid] = 0.0f;
  }
  for_each_token(row, [&](int32_t, float v) {
    const float s = value_of(v);
    if (s == -INFINITY) return;
    // Column `tid` of every level is this thread's alone: no atomics, and banks by thread.
    const int at = level_of(top, s) * kSampleThreads + tid;
    counts[at] += 1;
    if (with_mass) masses[at] += expf(s - top);
  });
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32;
  if (warp < kLevels) {
    int32_t count = 0;
    float mass = 0.0f;
    for (int j = lane; j < kSampleThreads; j += 32) {
      count += counts[warp * kSampleThreads + j];
      mass += masses[warp * kSampleThreads + j];
    }
    count = warp_sum_int(count);
    mass = warp_sum(mass);
    if (lane == 0) {
      levels.count[warp] = count;
      levels.mass[warp] = mass;
    }
  }
  if (row_parts() == 1) {
    __syncthreads();
    return;
  }
  auto cluster = cg::this_cluster();
  cluster.sync();  // every block's levels are summed
  int32_t count = 0;
  float mass = 0.0f;
  if (tid < kLevels) {
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
      const Levels* part = cluster.map_shared_rank(&levels, r);
      count += part->count[tid];
      mass += part->mass[tid];
    }
  }
  cluster.sync();  // every block has read every other's
  if (tid < kLevels) {
    levels.count[tid] = count;
    levels.mass[tid] = mass;
  }
  __syncthreads();
}

struct LevelValues {
  int level;       // the level searched
  int first;       // with `gathered`: the first block's workspace holds the values of levels first..level
  int32_t count;   // values in the workspace, or at `level` when not gathered
  bool gathered;   // the values are in the first block's workspace (floats, in no particular order)
  uint32_t min_key, max_key;  // of the values at `level`
};

// The values of the tokens at levels first..level (value_of as for level_histogram; `count` of them), gathered
// into the first block's workspace when they fit, and the key range of those at `level` either way.
template <typename ValueOf>
__device__ LevelValues gather_levels(const Row& row, float top, int first, int level, int32_t count,
                                     ValueOf value_of) {
  __shared__ int32_t filled;
  auto* values = reinterpret_cast<float*>(workspace);
  const bool gather = count <= kValueCapacity;
  __syncthreads();  // the workspace's previous use is over
  if (threadIdx.x == 0) filled = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  uint32_t min_key = UINT_MAX, max_key = 0;
  for_each_token(row, [&](int32_t, float v) {
    const float s = value_of(v);
    const int at = s != -INFINITY ? level_of(top, s) : kLevels;
    if (at == level) {
      min_key = min(min_key, order_key(s));
      max_key = max(max_key, order_key(s));
    }
    if (!gather) return;
    // One shared atomic per warp and step.
    const bool take = at >= first && at <= level;
    const unsigned takers = __ballot_sync(kFullMask, take);
    if (takers == 0) return;
    const int leader = __ffs(takers) - 1;
    int32_t base = 0;
    if (lane == leader) base = atomicAdd(&filled, __popc(takers));
    base = __shfl_sync(kFullMask, base, leader);
    if (take) values[base + __popc(takers & ((1u << lane) - 1))] = s;
  });
  LevelValues out;
  out.level = level;
  out.first = gather ? first : level;
  out.count = count;
  out.gathered = gather;
  out.min_key = row_reduce(min_key, Minimum{});  // also the barrier after the gathering
  out.max_key = row_reduce(max_key, Maximum{});
  if (gather) collect_at_first<float>(&filled);
  return out;
}

// visit(s) for every value at the level: from the workspace when gathered (the first block alone), else from this
// block's part of the row.
template <typename ValueOf, typename Visit>
__device__ void visit_level(const Row& row, float top, const LevelValues& values, ValueOf value_of, Visit visit) {
  if (values.gathered) {
    const auto* gathered = reinterpret_cast<const float*>(workspace);
    for (int i = threadIdx.x; i < values.count; i += kSampleThreads) {
      const float s = gathered[i];
      if (values.first == values.level || level_of(top, s) == values.level) visit(s);
    }
  } else {
    for_each_token(row, [&](int32_t, float v) {
      const float s = value_of(v);
      if (s != -INFINITY && level_of(top, s) == values.level) visit(s);
    });
  }
}

// The nearest value keys on either side of a bisection's middle: the lowest at or above it, the highest below.
struct KeyBounds {
  uint32_t at_or_above, below;
};
struct NearestKeys {
  __device__ KeyBounds operator()(const KeyBounds& a, const KeyBounds& b) const {
    return KeyBounds{min(a.at_or_above, b.at_or_above), max(a.below, b.below)};
  }
};

// The highest key K in [low, max_key] whose measure, `above` plus the sum of measure(s) over the values
// (visit_values(f) calls f(s) for each; spread over the row's blocks when `row_wide`, else this block's) with key
// >= K, reaches `target`, by bisection; `low` when even all of them fall short (rounding). low == max_key: no pass.
template <typename T, typename Measure, typename VisitValues>
__device__ uint32_t highest_key_reaching(bool row_wide, uint32_t low, uint32_t max_key, T above, T target,
                                         Measure measure, VisitValues visit_values) {
  uint64_t high = uint64_t{max_key} + 1;
  for (int step = 0; high - low > 1; ++step) {
    const auto middle = static_cast<uint32_t>(low + (high - low) / 2);
    T local = 0;
    KeyBounds bounds{UINT_MAX, 0};  // keys are never 0: -inf's is the lowest a visited value can have
    visit_values([&](float s) {
      const uint32_t key = order_key(s);
      if (key >= middle) {
        local += measure(s);
        bounds.at_or_above = min(bounds.at_or_above, key);
      } else {
        bounds.below = max(bounds.below, key);
      }
    });
    const bool reached = above + (row_wide ? row_reduce(local, Sum{}) : block_sum_step(local, step)) >= target;
    bounds = reduce_over(row_wide, bounds, NearestKeys{});
    // The measure only changes at the keys of values: the range shrinks to the nearest of them on the side that
    // holds the answer, so that k distinct values take about log2 k + 1 steps, however far apart their keys are.
    if (reached) {
      low = bounds.at_or_above != UINT_MAX ? bounds.at_or_above : middle;
    } else {
      high = bounds.below >= low ? uint64_t{bounds.below} + 1 : uint64_t{low} + 1;
    }
  }
  return low;
}

struct TopK {
  float kth;        // the k-th largest value; -inf when fewer than k are finite (nothing is cut)
  int32_t kept;     // >= 0: every value >= kth is in the first block's workspace, among `kept` gathered ones
};

// The k-th largest of the filtered values (value_of), ties included. The levels above the cut are gathered
// with it when they fit, so that top_p can work on the kept values in shared memory.
template <typename ValueOf>
__device__ TopK kth_value(Row row, float top, int32_t k, ValueOf value_of, Levels& levels) {
  level_histogram(row, top, false, value_of, levels);
  int32_t above = 0;
  int level = -1;
  for (int l = 0; l < kLevels && level < 0; ++l) {
    if (above + levels.count[l] >= k) {
      level = l;
    } else {
      above += levels.count[l];
    }
  }
  if (level < 0) return TopK{-INFINITY, -1};
  const int32_t through = above + levels.count[level];
  const bool all = through <= kValueCapacity;
  const LevelValues values =
      gather_levels(row, top, all ? 0 : level, level, all ? through : levels.count[level], value_of);
  auto search = [&] {
    return highest_key_reaching<int32_t>(
        !values.gathered, values.min_key, values.max_key, above, k, [](float) { return 1; },
        [&](auto&& visit) { visit_level(row, top, values, value_of, visit); });
  };
  uint32_t key;
  if (values.gathered) {
    key = from_first_block(row_part() == 0 ? search() : 0u);
  } else {
    key = search();
  }
  return TopK{key_value(key), all ? through : -1};
}

struct Nucleus {
  uint32_t boundary;  // tokens above it are kept, and the first `kept_ties` tied with it in token-id order
  int32_t kept_ties;
  float tie_weight;
};

// The nucleus edge among candidate values (row_wide, visit_values as for highest_key_reaching; keys in [low, max_key])
// that hold the edge, the kept mass above them being `above`: the highest key at which the mass at or above it
// reaches the target, and how many of the tokens tied there the target needs.
template <typename VisitValues>
__device__ Nucleus nucleus_among(bool row_wide, float top, float above, float target, uint32_t low, uint32_t max_key,
                                 VisitValues visit_values) {
  auto weight = [top](float s) { return expf(s - top); };
  Nucleus edge;
  edge.boundary = highest_key_reaching<float>(row_wide, low, max_key, above, target, weight, visit_values);
  float local_above = 0.0f;
  int32_t local_ties = 0;
  visit_values([&](float s) {
    const uint32_t key = order_key(s);
    if (key > edge.boundary) local_above += weight(s);
    local_ties += key == edge.boundary;
  });
  const float above_boundary = above + reduce_over(row_wide, local_above, Sum{});
  const int32_t ties = reduce_over(row_wide, local_ties, Sum{});
  // Of the tokens tied at the edge, the lower ids first, as many as the target needs (at least one; all of them
  // when their weight underflows).
  edge.tie_weight = weight(key_value(edge.boundary));
  const float needed = ceilf((target - above_boundary) / edge.tie_weight);
  edge.kept_ties = needed < static_cast<float>(ties) ? max(1, static_cast<int32_t>(fmaxf(needed, 1.0f))) : ties;
  return edge;
}

// The top_p edge over the filtered values (value_of) of the row: the level that holds it from the level masses,
// then that level's values.
template <typename ValueOf>
__device__ Nucleus nucleus_edge(Row row, float top, float top_p, ValueOf value_of, Levels& levels) {
  level_histogram(row, top, true, value_of, levels);
  float total = 0.0f;
  for (int l = 0; l < kLevels; ++l) total += levels.mass[l];
  const float target = top_p * total;
  // The first level whose cumulative mass reaches the target (the best token's level has mass 1, so some
  // non-empty level does; the last non-empty one should rounding say otherwise).
  float above = 0.0f, above_last = 0.0f;
  int level = -1, last = 0;
  for (int l = 0; l < kLevels && level < 0; ++l) {
    if (levels.count[l] == 0) continue;
    if (above + levels.mass[l] >= target) {
      level = l;
    } else {
      last = l;
      above_last = above;
      above += levels.mass[l];
    }
  }
  if (level < 0) {
    level = last;
    above = above_last;
  }
  const LevelValues values = gather_levels(row, top, level, level, levels.count[level], value_of);
  auto among = [&](bool row_wide) {
    return nucleus_among(row_wide, top, above, target, values.min_key, values.max_key,
                         [&](auto&& visit) { visit_level(row, top, values, value_of, visit); });
  };
  if (!values.gathered) return among(true);
  return from_first_block(row_part() == 0 ? among(false) : Nucleus{0, 0, 0.0f});
}

// The top_p edge over the `count` values in the first block's workspace, of which those >= kth are the kept ones.
__device__ Nucleus nucleus_of_gathered(int32_t count, float top, float kth, float top_p) {
  if (row_part() != 0) return from_first_block(Nucleus{0, 0, 0.0f});
  const auto* gathered = reinterpret_cast<const float*>(workspace);
  auto visit_kept = [&](auto&& visit) {
    for (int i = threadIdx.x; i < count; i += kSampleThreads) {
      const float s = gathered[i];
      if (s >= kth) visit(s);
    }
  };
  float local_total = 0.0f;
  visit_kept([&](float s) { local_total += expf(s - top); });
  const float target = top_p * block_reduce(local_total, Sum{});
  return from_first_block(nucleus_among(false, top, 0.0f, target, order_key(kth), order_key(top), visit_kept));
}

// What the draw keeps of s = raw / temperature: finite, at or above `floor` (min_p's threshold or the top_k-th
// value), and with a nucleus, above its boundary or among its first kept ties.
struct KeptSet {
  float temperature, top, floor;
  bool nucleus;
  Nucleus edge;
};

// The inverse-CDF draw of `uniform` over the kept tokens in token-id order; the token in the row's first block.
__device__ int32_t draw_kept(Row row, const KeptSet& kept_set, double uniform_draw) {
  __shared__ int32_t found, last_segment, token;
  // The settings, and the first block's segment arrays (every block writes its segments there, the first one
  // scans them), are read from shared memory where used: the pass has no registers to spare for them.
  __shared__ KeptSet kept;
  __shared__ double uniform;
  __shared__ double* first_segment_mass;
  __shared__ int32_t* first_segment_ties;
  // Masses in double beyond the 4 tokens of a lane: a float running sum over 10^5 tokens drifts by more than
  // the weight of the unlikely tokens it passes (the CPU sums in double).
  auto* segment_mass = reinterpret_cast<double*>(workspace);
  auto* segment_ties = reinterpret_cast<int32_t*>(segment_mass + kSegmentCapacity);
  const int64_t segments = (row.vocab + kSegmentTokens - 1) / kSegmentTokens;
  const int tid = threadIdx.x, lane = tid % 32;
  auto classify = [&](float v, float& weight, bool& tie) {
    const float s = v / kept.temperature;
    const bool keep = s != -INFINITY && s >= kept.floor && (!kept.nucleus || order_key(s) >= kept.edge.boundary);
    tie = keep && kept.nucleus && order_key(s) == kept.edge.boundary;
    weight = keep && !tie ? expf(s - kept.top) : 0.0f;
    return keep;
  };

  // 1. The mass of the kept tokens that are not ties at the edge, and the tie count, of every segment.
  if (tid == 0) {
    kept = kept_set;
    uniform = uniform_draw;
    found = INT_MAX;
    last_segment = -1;
    first_segment_mass = cg::this_cluster().map_shared_rank(segment_mass, 0);
    first_segment_ties = cg::this_cluster().map_shared_rank(segment_ties, 0);
  }
  if (row_parts() == 1) {
    __syncthreads();  // the workspace's previous use is over
  } else {
    sync_row();  // the first block's workspace is free
  }
  for_each_quad(row, [&](int64_t quad, const float4& v) {
    float mass = 0.0f;
    int32_t ties = 0;
    const float values[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float weight;
      bool tie;
      classify(values[j], weight, tie);
      mass += weight;
      ties += tie;
    }
    const double segment_total = warp_sum_double(mass);
    ties = warp_sum_int(ties);
    const int64_t segment = quad / 32;
    if (lane == 0 && segment < segments) {
      first_segment_mass[segment] = segment_total;
      first_segment_ties[segment] = ties;
    }
  });
  if (row_parts() == 1) {
    __syncthreads();
  } else {
    sync_row();  // every segment is in the first block
    if (row_part() != 0) return 0;
  }

  // 2. Block scans over the segments in id order (each thread a run of consecutive ones): first the ties, to
  // keep the first kept_ties of them, then the kept mass; each segment is left with its exclusive prefixes.
  const int64_t per_thread = (segments + kSampleThreads - 1) / kSampleThreads;
  const int64_t begin = min(int64_t{tid} * per_thread, segments), end = min(begin + per_thread, segments);
  int32_t run_ties = 0;
  for (int64_t s = begin; s < end; ++s) run_ties += segment_ties[s];
  using TieScan = cub::BlockScan<int32_t, kSampleThreads>;
  __shared__ typename TieScan::TempStorage tie_scan;
  int32_t ties_before;
  TieScan(tie_scan).ExclusiveSum(run_ties, ties_before);
  double run_mass = 0.0;
  for (int64_t s = begin; s < end; ++s) {
    const int32_t ties = segment_ties[s];
    const int32_t kept_here = min(max(kept.edge.kept_ties - ties_before, 0), ties);
    segment_ties[s] = ties_before;
    ties_before += ties;
    segment_mass[s] += static_cast<double>(kept_here) * kept.edge.tie_weight;
    run_mass += segment_mass[s];
  }
  double total;
  double mass_before = block_exclusive_sum(run_mass, total);
  const double target = uniform * total;
  for (int64_t s = begin; s < end; ++s) {
    const double mass = segment_mass[s];
    const double after = mass_before + mass;
    if (mass > 0.0) {
      if (mass_before <= target && target < after) atomicMin(&found, static_cast<int32_t>(s));
      atomicMax(&last_segment, static_cast<int32_t>(s));
    }
    segment_mass[s] = mass_before;
    mass_before = after;
  }
  __syncthreads();

  // 3. One warp scans the segment: the first kept token whose cumulative mass passes the target, or the last kept
  // one of the last non-empty segment when rounding left the target at or above the total.
  if (tid < 32) {
    const bool passed = found != INT_MAX;
    const int64_t segment = passed ? found : last_segment;
    if (segment >= 0) {
      const int64_t quad = segment * 32 + lane;
      const float4 v = load_quad(row, quad);
      const float values[4] = {v.x, v.y, v.z, v.w};
      float weight[4];
      bool keep[4], tie[4];
      int32_t lane_ties = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        keep[j] = classify(values[j], weight[j], tie[j]);
        lane_ties += tie[j];
      }
      int32_t tie_index = segment_ties[segment] + warp_exclusive_sum(lane_ties);
      double lane_mass = 0.0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (tie[j]) {
          keep[j] = tie_index++ < kept.edge.kept_ties;
          weight[j] = keep[j] ? kept.edge.tie_weight : 0.0f;
        }
        lane_mass += weight[j];
      }
      double cumulative = segment_mass[segment] + warp_exclusive_sum(lane_mass);
      int32_t hit = INT_MAX, last = -1;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (!keep[j]) continue;
        cumulative += weight[j];
        last = static_cast<int32_t>(quad * 4 + j);
        if (passed && hit == INT_MAX && cumulative > target) hit = last;
      }
      for (int offset = 16; offset > 0; offset >>= 1) {
        hit = min(hit, __shfl_xor_sync(kFullMask, hit, offset));
        last = max(last, __shfl_xor_sync(kFullMask, last, offset));
      }
      if (lane == 0) token = hit != INT_MAX ? hit : max(last, 0);
    } else if (lane == 0) {
      token = 0;
    }
  }
  __syncthreads();
  return token;
}

// The best `count` raw tokens ranked after `previous` one at a time, from the row (no gathering); the first block
// writes them.
__device__ void top_from_row(Row row, int32_t count, float log_total, int32_t* ids, float* logprobs) {
  Candidate previous{INFINITY, -1};
  for (int32_t j = 0; j < count; ++j) {
    Candidate best{-INFINITY, INT_MAX};
    for_each_token(row, [&](int32_t id, float v) {
      const bool after = v < previous.value || (v == previous.value && id > previous.id);
      if (after && id < row.vocab && ranks_before(v, id, best)) best = Candidate{v, id};
    });
    previous = row_reduce(best, BetterCandidate{});
    if (threadIdx.x == 0 && row_part() == 0) {
      ids[j] = previous.id;
      logprobs[j] = previous.value - log_total;
    }
  }
}

// Filters the scaled row (temperature -> min_p -> top_k -> top_p) and draws from what is kept; `raw_max` is the
// finite maximum of the raw row.
__device__ int32_t filter_and_draw(Row row, const SampleRowParams& p, float raw_max, Levels& levels) {
  const float temperature = p.temperature;
  KeptSet kept;
  kept.temperature = temperature;
  // Division by a positive temperature is monotonic, so this is the maximum of the scaled row.
  kept.top = raw_max / temperature;
  kept.floor = p.min_p > 0.0f ? kept.top + logf(p.min_p) : -INFINITY;
  kept.nucleus = false;
  kept.edge = Nucleus{0, 0, 0.0f};
  int32_t gathered = -1;
  if (p.top_k > 0 && p.top_k < row.vocab) {
    const float floor = kept.floor;
    const TopK cut = kth_value(row, kept.top, p.top_k, [=](float v) {
      const float s = v / temperature;
      return s >= floor ? s : -INFINITY;
    }, levels);
    kept.floor = fmaxf(floor, cut.kth);
    gathered = cut.kept;
  }
  if (p.top_p < 1.0f) {
    const float floor = kept.floor;
    kept.nucleus = true;
    kept.edge = gathered >= 0 ? nucleus_of_gathered(gathered, kept.top, floor, p.top_p)
                              : nucleus_edge(row, kept.top, p.top_p, [=](float v) {
                                  const float s = v / temperature;
                                  return s >= floor ? s : -INFINITY;
                                }, levels);
  }
  return draw_kept(row, kept, p.uniform);
}

// The logprob outputs of one row: log_softmax of the raw row at `token`, its rank, and the best `num_top`, written
// by the row's first block.
__device__ void write_logprobs(Row row, int32_t token, float raw_max, int32_t num_top, float* logprob,
                                            int32_t* rank, int32_t* ids, float* top, Levels& levels) {
  // The sum of exp, the rank and (for the top ones) the levels, in one pass.
  const float token_value = clean(row.x[token]);
  float local_sum = 0.0f;
  int32_t local_higher = 0;
  level_histogram(row, raw_max, false, [&](float v) {
    local_sum += expf(v - raw_max);
    local_higher += v > token_value;
    return num_top > 0 ? v : -INFINITY;
  }, levels);
  const float log_total = raw_max + logf(row_reduce(local_sum, Sum{}));
  const int32_t higher = row_reduce(local_higher, Sum{});
  if (threadIdx.x == 0 && row_part() == 0) {
    *logprob = token_value - log_total;
    *rank = 1 + higher;
  }
  if (num_top == 0) return;

  // The best levels that hold num_top tokens hold the best num_top.
  int32_t candidates = 0;
  int level = -1;
  for (int l = 0; l < kLevels && level < 0; ++l) {
    candidates += levels.count[l];
    if (candidates >= num_top) level = l;
  }
  if (level < 0 || candidates > kPairCapacity) {
    top_from_row(row, num_top, log_total, ids, top);
    return;
  }
  __shared__ int32_t filled;
  auto* pairs = reinterpret_cast<Candidate*>(workspace);
  __syncthreads();  // the workspace's previous use is over
  if (threadIdx.x == 0) filled = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for_each_token(row, [&](int32_t id, float v) {
    const bool take = v != -INFINITY && level_of(raw_max, v) <= level;
    const unsigned takers = __ballot_sync(kFullMask, take);
    if (takers == 0) return;
    const int leader = __ffs(takers) - 1;
    int32_t base = 0;
    if (lane == leader) base = atomicAdd(&filled, __popc(takers));
    base = __shfl_sync(kFullMask, base, leader);
    if (take) pairs[base + __popc(takers & ((1u << lane) - 1))] = Candidate{v, id};
  });
  __syncthreads();
  collect_at_first<Candidate>(&filled);
  if (row_part() != 0) return;
  // Each pick takes the best candidate ranked after the previous pick.
  Candidate previous{INFINITY, -1};
  for (int32_t j = 0; j < num_top; ++j) {
    Candidate best{-INFINITY, INT_MAX};
    for (int i = threadIdx.x; i < candidates; i += kSampleThreads) {
      const Candidate c = pairs[i];
      const bool after = c.value < previous.value || (c.value == previous.value && c.id > previous.id);
      if (after && ranks_before(c.value, c.id, best)) best = c;
    }
    previous = block_reduce(best, BetterCandidate{});
    if (threadIdx.x == 0) {
      ids[j] = previous.id;
      top[j] = previous.value - log_total;
    }
  }
}

// Where a row's blocks start: exchange slots in their first turn.
__device__ __forceinline__ void start_row() {
  if (threadIdx.x == 0) exchange_turn = 0;
  __syncthreads();
}

// Where a row's blocks end: none leaves while another may still read its shared memory.
__device__ __forceinline__ void end_row() {
  if (row_parts() > 1) sync_row();
}

// The token of each row, one cluster of row_parts() blocks per row. Rows that ask for logprobs leave the raw
// maximum in their logprob slot for logprob_kernel (a kernel of its own, so that neither runs out of the 64
// registers of 1024 threads).
__global__ void __launch_bounds__(kSampleThreads, 1)
    sample_kernel(const float* logits, int64_t vocab, const SampleRowParams* rows, int32_t* tokens, float* logprobs) {
  __shared__ Levels levels;
  // The row's settings from shared memory where used: the passes have no registers to spare for them.
  __shared__ SampleRowParams p;
  const int64_t item = blockIdx.x / row_parts();
  if (threadIdx.x == 0) p = rows[item];
  start_row();
  const float* x = logits + int64_t{p.logit_row} * vocab;
  const Row row{x, vocab, reinterpret_cast<uintptr_t>(x) % 16 == 0};

  // The raw maximum and its lowest id: a thread visits its tokens in increasing id order, so a strictly higher
  // value alone replaces its best; a row without a finite logit leaves the id at INT_MAX.
  Candidate local_best{-INFINITY, INT_MAX};
  for_each_token(row, [&](int32_t id, float v) {
    if (v > local_best.value) local_best = Candidate{v, id};
  });
  const Candidate raw_best = row_reduce(local_best, BetterCandidate{});

  int32_t token = 0;
  if (p.greedy) {
    token = raw_best.id < vocab ? raw_best.id : 0;
  } else if (raw_best.value != -INFINITY) {
    token = filter_and_draw(row, p, raw_best.value, levels);
  }
  if (threadIdx.x == 0 && row_part() == 0) {
    tokens[blockIdx.x / row_parts()] = token;
    if (p.num_logprobs >= 0) logprobs[blockIdx.x / row_parts()] = raw_best.value;
  }
  end_row();
}

// The logprob outputs of the rows that ask for them, after sample_kernel.
__global__ void __launch_bounds__(kSampleThreads, 1)
    logprob_kernel(const float* logits, int64_t vocab, const SampleRowParams* rows, const int32_t* tokens,
                   float* logprobs, int32_t* ranks, int32_t* top_ids, float* top_logprobs, int32_t top_width) {
  __shared__ Levels levels;
  const int64_t item = blockIdx.x / row_parts();
  const SampleRowParams p = rows[item];
  if (p.num_logprobs < 0) return;
  start_row();
  const float* x = logits + int64_t{p.logit_row} * vocab;
  const Row row{x, vocab, reinterpret_cast<uintptr_t>(x) % 16 == 0};
  const int64_t at = item * top_width;
  write_logprobs(row, tokens[item], logprobs[item], p.num_logprobs, logprobs + item, ranks + item, top_ids + at,
                 top_logprobs + at, levels);
  end_row();
}

// The launch of `count` rows of `parts` blocks each, a cluster per row (`cluster` holds its attribute).
cudaLaunchConfig_t row_launch(int32_t count, int parts, cudaStream_t stream, cudaLaunchAttribute& cluster) {
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned int>(parts);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned int>(count) * static_cast<unsigned int>(parts));
  config.blockDim = dim3(kSampleThreads);
  config.dynamicSmemBytes = kWorkspaceBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return config;
}

// Whether the GPU can schedule a cluster of `parts` blocks of the sampling kernels (each fills an SM), asked once.
bool cluster_fits(int parts) {
  static const std::array<bool, kMaxRowParts + 1> fits = [] {
    std::array<bool, kMaxRowParts + 1> result{};
    for (int size = 1; size <= kMaxRowParts; size *= 2) {
      cudaLaunchAttribute cluster{};
      const cudaLaunchConfig_t config = row_launch(1, size, nullptr, cluster);
      int clusters = 0;
      const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, sample_kernel, &config);
      if (status != cudaSuccess) cudaGetLastError();  // a refused size leaves no error for a later launch to report
      result[size] = status == cudaSuccess && clusters > 0;
    }
    return result;
  }();
  return fits[parts];
}

cudaError_t allow_workspace() {
  static const cudaError_t status = [] {
    const cudaError_t sample_status =
        cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWorkspaceBytes);
    if (sample_status != cudaSuccess) return sample_status;
    return cudaFuncSetAttribute(logprob_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWorkspaceBytes);
  }();
  return status;
}

}  // namespace

cudaError_t sample(const float* logits, int64_t vocab, const SampleRowParams* rows, int32_t count, int32_t* tokens,
                   float* logprobs, int32_t* ranks, int32_t* top_ids, float* top_logprobs, int32_t top_width,
                   cudaStream_t stream, bool row_invariant) {
  if (count == 0) return cudaSuccess;
  // The draw keeps one mass and one tie count per 128-token segment in the workspace.
  if (vocab <= 0 || (vocab + kSegmentTokens - 1) / kSegmentTokens > kSegmentCapacity) return cudaErrorInvalidValue;
  if (const cudaError_t status = allow_workspace(); status != cudaSuccess) return status;
  int device = 0, sms = 0;
  if (const cudaError_t status = cudaGetDevice(&device); status != cudaSuccess) return status;
  if (const cudaError_t status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      status != cudaSuccess)
    return status;
  // Blocks per row: the most, up to a cluster of kMaxRowParts, that keep every row's blocks on the GPU at once
  // (one block per SM), give each block at least one whole pass of its own (below that the cluster's barriers
  // cost more than the split saves: measured with `backend_ops perf sample`, bench/results/2026-12-01-small-ops.md), and that
  // the GPU can schedule as a cluster.
  const int64_t passes = (vocab + 4 * int64_t{kUnroll} * kSampleThreads - 1) / (4 * int64_t{kUnroll} * kSampleThreads);
  int parts = kMaxRowParts;
  // Row-invariant: the count as if one row (more rows then take more waves of clusters, not smaller clusters).
  const int64_t sharing = row_invariant ? 1 : int64_t{count};
  while (parts > 1 && (sharing * parts > sms || parts > passes || !cluster_fits(parts))) parts /= 2;
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config = row_launch(count, parts, stream, cluster);
  if (const cudaError_t status = cudaLaunchKernelEx(&config, sample_kernel, logits, vocab, rows, tokens, logprobs);
      status != cudaSuccess || logprobs == nullptr)
    return status;
  return cudaLaunchKernelEx(&config, logprob_kernel, logits, vocab, rows, tokens, logprobs, ranks, top_ids,
                            top_logprobs, top_width);
}

}  // namespace beamline::cuda
