// Prefill attention on Hopper's warpgroup MMAs (wgmma.mma_async, sm_90a) for head_dim 128, BF16 KV pools and BF16
// operands (OperandPrecision::Bf16; Split stays on the mma.sync kernel, attention/prefill_mma.cu). A block
// serves the same kVectors = 128 query vectors as the mma.sync kernel — (row, head of the group) pairs of
// consecutive rows of one sequence and one kv head — so every K/V tile is shared by the whole GQA group, with the
// same masks (causal, window, keys past the sequence, cached keys before a chunk, missing blocks -> NaN rows) and
// numerics (q rounded to BF16 once, P once per tile, FP32 accumulation).
//
// Persistent: one block per multiprocessor serves items (a tile of the plan's list and a kv head) one after another,
// so that the producer copies an item's first K/V tiles while the consumers still compute on the previous item.
// Warp specialization, three warpgroups: warpgroup 0 produces, copying 128-key K and V tiles of the paged pool with
// 16-byte cp.async (a tile starts at any key and spans several pool blocks) into kKeyStages K and kValueStages V
// stages of 128-byte-swizzled shared memory, signalling each stage's "full" mbarrier as its copies land and waiting
// on its "empty" one before refilling it; each key's block is looked up once per tile, and V of tile t - kValueLag
// is copied after K of tile t (the consumers need K of a tile one round before its V).
// Warpgroups 1 and 2 consume, 64 vectors each: S = q Kᵀ is an m64n128k16 wgmma with q and K both read from
// shared memory through matrix descriptors (head dim contiguous: K-major), O += P V one with P from the S registers
// (the accumulator layout is the A operand's register layout) and V from shared memory as an MN-major operand.
// Within a warpgroup the softmax of tile t overlaps the P V product of tile t - 1 (both issued before the wait for
// S); the two consumer warpgroups take turns to issue (ping-pong, named barriers), so that one's softmax runs
// while the other's products do. setmaxnreg gives the consumers the registers the producer does not need (S, O
// and P take 160 per thread). A consumer issues all its q loads before it converts any, and the producer does not
// wait for q.
// Measured, with what limits it: bench/results/2026-12-01-prefill-wgmma.md.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/common/async_copy.cuh"
#include "backend/cuda/attention/attention_common.cuh"
#include "backend/cuda/common/mbarrier.cuh"

namespace beamline::cuda {
namespace {

constexpr int kDim = kFastHeadDim;
constexpr int kKeys = 128;                                   // keys per K/V tile: the n of S = q Kᵀ, the k of P V
constexpr int kGroupVectors = 64;                            // query vectors per consumer warpgroup: the wgmma m
constexpr int kConsumerGroups = 2;
constexpr int kVectors = kConsumerGroups * kGroupVectors;    // query vectors per block
static_assert(kVectors == kPrefillTileVectors, "the tiles the plan lists for the mma.sync kernel");
constexpr int kGroupThreads = 128;                           // a warpgroup
constexpr int kThreads = kGroupThreads * (1 + kConsumerGroups);
constexpr int kConsumerWarps = kConsumerGroups * kGroupThreads / 32;
constexpr int kWarpgroupBarrier = 1;  // + warpgroup: named barrier of one warpgroup (0 is __syncthreads)
// + consumer: the consumer warpgroup may issue its wgmmas (ping-pong)
constexpr int kSchedulerBarrier = kWarpgroupBarrier + 1 + kConsumerGroups;
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;  // 40 + 2 * 232 = 3 * 168, the launch's share
constexpr float kLog2e = 1.4426950408889634f;

// Operand tiles of `rows` rows of kDim BF16 in the canonical 128-byte-swizzled layout: two column halves of 64
// values (128 bytes per row), each `rows` x 128 bytes, 1024-byte aligned; 16-byte chunk c of a row's half is
// stored at chunk c ^ (row % 8), so 8 consecutive rows of one chunk hit 8 distinct bank groups.
constexpr int kSwizzleBytes = 128;
constexpr int kRowGroupBytes = 8 * kSwizzleBytes;  // 8 rows: the stride of a descriptor's core-matrix rows
constexpr int kQueryHalfBytes = kGroupVectors * kSwizzleBytes;
constexpr int kTileHalfBytes = kKeys * kSwizzleBytes;
constexpr int kQueryTileBytes = 2 * kQueryHalfBytes, kTileBytes = 2 * kTileHalfBytes;
constexpr size_t kSharedAlignment = 1024;  // of a swizzled tile; dynamic shared memory guarantees less

template <int kRows>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * kRows * kSwizzleBytes + row * kSwizzleBytes +
                               (((chunk % 8) ^ (row % 8)) << 4));
}

// A wgmma matrix descriptor for a 128-byte-swizzled operand at shared address `address`: `leading` is the byte
// stride between 64-value column halves along the operand's contiguous dimension (MN-major operands; K-major ones
// with a 16-value k step never cross a half and ignore it), `stride` the one between groups of 8 rows.
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading, uint32_t stride) {
  constexpr uint64_t kSwizzle128 = uint64_t{1} << 62;
  return uint64_t{(address & 0x3ffff) >> 4} | uint64_t{leading >> 4} << 16 | uint64_t{stride >> 4} << 32 |
         kSwizzle128;
}

#define BEAMLINE_WGMMA_ACCUMULATORS "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#define BEAMLINE_WGMMA_ACCUMULATOR_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (64 x 128, FP32) = a (64 x 16) b (16 x 128) + (accumulate ? d : 0), both operands BF16 in shared memory and
// K-major (q's and K's head dimension contiguous).
__device__ __forceinline__ void mma_shared(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " BEAMLINE_WGMMA_ACCUMULATORS
      ", %64, %65, accumulate, 1, 1, 0, 0;\n}\n"
      : BEAMLINE_WGMMA_ACCUMULATOR_OPERANDS(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 128, FP32) += a (64 x 16, BF16 pairs in this thread's A-fragment registers) b (16 x 128, BF16 in shared
// memory, MN-major: V's head dimension contiguous).
__device__ __forceinline__ void mma_registers(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " BEAMLINE_WGMMA_ACCUMULATORS
      ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : BEAMLINE_WGMMA_ACCUMULATOR_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#undef BEAMLINE_WGMMA_ACCUMULATORS
#undef BEAMLINE_WGMMA_ACCUMULATOR_OPERANDS

// Orders this warpgroup's register writes before the wgmmas that read them.
__device__ __forceinline__ void mma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most kPending of this warpgroup's newest wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void mma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Ties the accumulators to this point of the program, so that no access to them moves across an mma_wait.
__device__ __forceinline__ void pin(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Makes this thread's generic-proxy shared-memory writes (st.shared, and the cp.async copies it has seen land)
// visible to the async proxy that wgmma reads shared memory through.
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// 2^x by the special-function unit alone (exp2f adds a denormal-result path; a probability below 2^-126 is 0 for
// every purpose here).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

constexpr int kQueryLoads = kGroupVectors * kDim / 4 / kGroupThreads;  // float4 of q per consumer thread

// 3 K stages and 2 V stages (192 KiB with the q tiles; 3 of each do not fit in 227 KiB beside the offset buffers).
constexpr int kKeyStages = 3, kValueStages = 2;
constexpr int kValueLag = 2;  // V of tile t - kValueLag is copied after K of tile t
// The buffer written for tile t + 1 must be neither K's of tile t nor V's of tile t - kValueLag, which producer
// threads still behind the barrier after the lookups of tile t + 1 may read.
constexpr int kOffsetBuffers = kValueLag + 2;
constexpr size_t kSharedBytes =
    size_t{kConsumerGroups} * kQueryTileBytes + size_t{kKeyStages + kValueStages} * kTileBytes;

__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_wgmma_kernel(const float* q, PoolGeometry pool, int32_t slot, BatchGeometry batch,
                                   const int32_t* tile_list, int32_t list_tiles, int32_t num_heads, float scale,
                                   int32_t sliding_window, float* out) {
  extern __shared__ unsigned char dynamic_shared[];
  __shared__ uint64_t key_full[kKeyStages], key_empty[kKeyStages], value_full[kValueStages],
      value_empty[kValueStages];
  // Per K stage, which keys of its tile have no pool block (bit k % 32 of word k / 32).
  __shared__ __align__(16) uint32_t missing_keys[kKeyStages][kKeys / 32];
  __shared__ int64_t key_offsets[kOffsetBuffers][kKeys];  // the producer's pool offsets of a tile's keys
  // Per item parity, warpgroup and warp: the union of the visible keys of the warp's 32 vectors (first, last).
  __shared__ int32_t warp_ranges[2][1 + kConsumerGroups][kGroupThreads / 32][2];

  unsigned char* shared =
      dynamic_shared + ((kSharedAlignment - shared_address(dynamic_shared) % kSharedAlignment) % kSharedAlignment);
  const uint32_t query_tiles = shared_address(shared);
  const uint32_t key_tiles = query_tiles + kConsumerGroups * kQueryTileBytes;
  const uint32_t value_tiles = key_tiles + kKeyStages * kTileBytes;

  const int32_t group = num_heads / pool.num_kv_heads;
  // Broadcast from lane 0, so that the compiler knows the role (and below, the tile bounds) to be warp-uniform:
  // wgmma in code it cannot prove convergent is serialized.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kGroupThreads), 0);
  const int thread = threadIdx.x % kGroupThreads;
  const int warp = thread / 32, lane = threadIdx.x % 32;
  const int consumer = warpgroup - 1;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kKeyStages; ++s) {
      init_mbarrier(&key_full[s], kGroupThreads + kGroupThreads / 32);  // every copy, and the missing-key words
      init_mbarrier(&key_empty[s], kConsumerWarps);
    }
    for (int s = 0; s < kValueStages; ++s) {
      init_mbarrier(&value_full[s], kGroupThreads);
      init_mbarrier(&value_empty[s], kConsumerWarps);
    }
  }
  __syncthreads();

  // Persistent: the block serves items (a tile of the list and a kv head) pass after pass, in snake order over the
  // blocks (so that, heavy items first, every block's sum of items is about the same), until they run out. Every
  // warpgroup walks the same items and works out each one's key range itself, so the producer starts an item's
  // copies as soon as it is done with the previous item's, while the consumers still compute on it.
  const int32_t items = list_tiles * pool.num_kv_heads;
  auto item_of = [&](int32_t pass) {
    const int32_t in_pass = pass % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
    return pass * static_cast<int32_t>(gridDim.x) + in_pass;
  };
  // An item's tile of the list, heavy first: a sequence's later tiles see more keys (causal).
  auto list_index = [&](int32_t item) {
    const int32_t in_head = item % list_tiles;
    return list_tiles - 1 - in_head;
  };
  struct Work {
    int32_t sequence, first_row, vectors, kv_head;
    int32_t first_key, last_key, tiles;  // the keys some vector of the block sees, and its key tiles
    int32_t group_first, group_last;     // the keys some vector of this consumer warpgroup sees
  };
  // Reads the item's tile and, through one barrier of this warpgroup, its key ranges: thread i of every
  // warpgroup takes vector i of the block (kGroupThreads = kVectors), so consumer g's vectors are warps 2g, 2g+1.
  auto describe = [&](int32_t item, int32_t pass) {
    Work work;
    const int32_t index = list_index(item);
    work.kv_head = item / list_tiles;
    work.sequence = tile_list[3 * index];
    work.first_row = tile_list[3 * index + 1];
    work.vectors = tile_list[3 * index + 2] * group;
    int32_t first = INT_MAX, last = -1;
    if (thread < work.vectors) {
      const int64_t seq_len = batch.seq_lens[work.sequence];
      const int64_t position = batch.positions[work.first_row + thread / group];
      const int32_t low =
          sliding_window > 0 ? static_cast<int32_t>(max(int64_t{0}, position - sliding_window + 1)) : 0;
      const int32_t high = static_cast<int32_t>(min(position, seq_len - 1));
      if (low <= high) {
        first = low;
        last = high;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      first = min(first, __shfl_xor_sync(0xffffffffu, first, offset));
      last = max(last, __shfl_xor_sync(0xffffffffu, last, offset));
    }
    int32_t(&ranges)[kGroupThreads / 32][2] = warp_ranges[pass % 2][warpgroup];
    if (lane == 0) {
      ranges[warp][0] = first;
      ranges[warp][1] = last;
    }
    // The buffer of pass + 2 is written only after every warp has passed this barrier again, for pass + 1.
    asm volatile("bar.sync %0, %1;\n" ::"r"(kWarpgroupBarrier + warpgroup), "n"(kGroupThreads) : "memory");
    work.first_key = INT_MAX;
    work.last_key = -1;
#pragma unroll
    for (int w = 0; w < kGroupThreads / 32; ++w) {
      work.first_key = min(work.first_key, ranges[w][0]);
      work.last_key = max(work.last_key, ranges[w][1]);
    }
    work.tiles = work.first_key <= work.last_key ? (work.last_key - work.first_key) / kKeys + 1 : 0;
    const int g = max(consumer, 0);
    work.group_first = min(ranges[2 * g][0], ranges[2 * g + 1][0]);
    work.group_last = max(ranges[2 * g][1], ranges[2 * g + 1][1]);
    return work;
  };

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    // Per tile, thread `thread` looks up key `thread` once: its pool offset (-1: past last_key or no block) goes to
    // key_offsets, for the copies of K and, kValueLag tiles later, V. Then it copies 16-byte chunk thread % 16 of
    // key thread / 16 + 8 * pass in each of 16 passes: every pass reads 8 whole rows, and the swizzled destination
    // moves by 8 rows per pass. Stages, phases and offset buffers count the tiles of all items so far.
    const int part = thread % 16, key_in_pass = thread / 16;
    const uint32_t destination = swizzled<kKeys>(key_in_pass, part);
    auto copy_tile = [&](const int64_t* offsets, uint32_t tile, const __nv_bfloat16* source) {
#pragma unroll
      for (int pass = 0; pass < kKeys / 8; ++pass) {
        const int64_t offset = offsets[8 * pass + key_in_pass];
        copy_async16(tile + destination + pass * kRowGroupBytes, source + (offset >= 0 ? offset + part * 8 : 0),
                     offset >= 0);
      }
    };
    const __nv_bfloat16* k_pool = static_cast<const __nv_bfloat16*>(pool.k);
    const __nv_bfloat16* v_pool = static_cast<const __nv_bfloat16*>(pool.v);
    int32_t produced = 0;
    for (int32_t pass = 0; item_of(pass) < items; ++pass) {
      const Work work = describe(item_of(pass), pass);
      const KeyRows rows = key_rows(pool, batch, work.sequence, slot, work.kv_head);
      for (int32_t tile = 0; tile < work.tiles + kValueLag; ++tile) {
        if (tile < work.tiles) {
          const int32_t count = produced + tile;
          const int stage = count % kKeyStages;
          int64_t* offsets = key_offsets[count % kOffsetBuffers];
          const int32_t t = work.first_key + tile * kKeys + thread;
          const int32_t block = t <= work.last_key ? rows.block_of(t) : -1;
          offsets[thread] = block >= 0 ? rows.offset(block, t) : -1;
          const uint32_t missing = __ballot_sync(0xffffffffu, t <= work.last_key && block < 0);
          asm volatile("bar.sync %0, %1;\n" ::"n"(kWarpgroupBarrier), "n"(kGroupThreads) : "memory");
          wait_mbarrier(&key_empty[stage], ((count / kKeyStages) & 1) ^ 1);
          copy_tile(offsets, key_tiles + stage * kTileBytes, k_pool);
          arrive_mbarrier_when_copied(&key_full[stage]);
          if (lane == 0) {
            missing_keys[stage][warp] = missing;
            arrive_mbarrier(&key_full[stage]);
          }
        }
        if (tile >= kValueLag) {
          const int32_t count = produced + tile - kValueLag;
          const int stage = count % kValueStages;
          wait_mbarrier(&value_empty[stage], ((count / kValueStages) & 1) ^ 1);
          copy_tile(key_offsets[count % kOffsetBuffers], value_tiles + stage * kTileBytes, v_pool);
          arrive_mbarrier_when_copied(&value_full[stage]);
        }
      }
      produced += work.tiles;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  const uint32_t query_tile = query_tiles + consumer * kQueryTileBytes;
  const float scale_log2 = scale * kLog2e;
  int32_t consumed = 0;  // key tiles of the earlier items: stages and phases count on from there
  auto key_stage = [&](int32_t tile) { return (consumed + tile) % kKeyStages; };
  auto key_parity = [&](int32_t tile) { return static_cast<uint32_t>((consumed + tile) / kKeyStages) & 1u; };
  auto value_stage = [&](int32_t tile) { return (consumed + tile) % kValueStages; };
  auto value_parity = [&](int32_t tile) { return static_cast<uint32_t>((consumed + tile) / kValueStages) & 1u; };
  for (int32_t pass = 0; item_of(pass) < items; ++pass) {
    const int32_t item = item_of(pass);
    // q first: all of a thread's loads are in flight while the ranges are worked out; the barrier in `describe`
    // also orders the previous item's S wgmmas, which read the q tile, before the stores below.
    const int32_t item_row = tile_list[3 * list_index(item) + 1];
    const int32_t item_vectors = tile_list[3 * list_index(item) + 2] * group;
    const int32_t item_head = item / list_tiles;
    float4 query[kQueryLoads];
#pragma unroll
    for (int i = 0; i < kQueryLoads; ++i) {
      const int index = thread + i * kGroupThreads;
      const int vector = consumer * kGroupVectors + index / (kDim / 4);
      query[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (vector < item_vectors) {
        const int64_t row = item_row + vector / group;
        const int32_t head = item_head * group + vector % group;
        query[i] = __ldg(reinterpret_cast<const float4*>(q + (row * num_heads + head) * kDim) + index % (kDim / 4));
      }
    }
    const Work work = describe(item, pass);

    // A consumer thread's vectors are rows lane / 4 (half 0) and lane / 4 + 8 (half 1) of its warp's 16 rows of
    // the warpgroup's 64; their visible keys are [lowest, highest] (empty for padding vectors). The warp's bounds
    // over its non-empty vectors decide which tiles it masks, the warpgroup's which it skips.
    int32_t lowest[2] = {1, 1}, highest[2] = {0, 0};
    int32_t lowest_max = -1, highest_min = INT_MAX;
    {
      const int64_t seq_len = batch.seq_lens[work.sequence];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int vector = consumer * kGroupVectors + warp * 16 + 8 * h + lane / 4;
        if (vector < work.vectors) {
          const int64_t position = batch.positions[work.first_row + vector / group];
          lowest[h] =
              sliding_window > 0 ? static_cast<int32_t>(max(int64_t{0}, position - sliding_window + 1)) : 0;
          highest[h] = static_cast<int32_t>(min(position, seq_len - 1));
        }
        if (lowest[h] <= highest[h]) {
          lowest_max = max(lowest_max, lowest[h]);
          highest_min = min(highest_min, highest[h]);
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        lowest_max = max(lowest_max, __shfl_xor_sync(0xffffffffu, lowest_max, offset));
        highest_min = min(highest_min, __shfl_xor_sync(0xffffffffu, highest_min, offset));
      }
    }

#pragma unroll
    for (int i = 0; i < kQueryLoads; ++i) {
      const int index = thread + i * kGroupThreads;
      const int local = index / (kDim / 4), d = index % (kDim / 4) * 4;
      const uint32_t offset = query_tile + swizzled<kGroupVectors>(local, d / 8) + (d % 8) * 2;
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(offset), "r"(pack_bf16(query[i].x, query[i].y)),
                   "r"(pack_bf16(query[i].z, query[i].w))
                   : "memory");
    }
    fence_async_proxy();
    asm volatile("bar.sync %0, %1;\n" ::"r"(kWarpgroupBarrier + warpgroup), "n"(kGroupThreads) : "memory");
    // The tiles some vector of this warpgroup sees: [seen_first, seen_last] (empty when it has none).
    int32_t seen_first = work.tiles, seen_last = -1;
    if (work.group_last >= 0 && work.tiles > 0) {
      seen_first = (work.group_first - work.first_key) / kKeys;
      seen_last = min(work.tiles - 1, (work.group_last - work.first_key) / kKeys);
    }
    seen_first = __shfl_sync(0xffffffffu, seen_first, 0);
    seen_last = __shfl_sync(0xffffffffu, seen_last, 0);

    auto release = [&](uint64_t* barrier) {
      __syncwarp();
      if (lane == 0) arrive_mbarrier(barrier);
    };
    // A tile this warpgroup does not see: waited for (so that no warp's arrivals run a phase ahead) and released.
    auto pass_over_keys = [&](int32_t tile) {
      if (lane == 0) {
        wait_mbarrier(&key_full[key_stage(tile)], key_parity(tile));
        arrive_mbarrier(&key_empty[key_stage(tile)]);
      }
      __syncwarp();
    };
    auto pass_over_values = [&](int32_t tile) {
      if (lane == 0) {
        wait_mbarrier(&value_full[value_stage(tile)], value_parity(tile));
        arrive_mbarrier(&value_empty[value_stage(tile)]);
      }
      __syncwarp();
    };
    // The wgmma operands of a tile: wait until its copies have landed (then fence_async_proxy), and issue.
    auto await_keys = [&](int32_t tile) { wait_mbarrier(&key_full[key_stage(tile)], key_parity(tile)); };
    auto await_values = [&](int32_t tile) { wait_mbarrier(&value_full[value_stage(tile)], value_parity(tile)); };
    auto query_keys = [&](float(&score)[64], int32_t tile) {
      const uint32_t key_tile = key_tiles + key_stage(tile) * kTileBytes;
  #pragma unroll
      for (int step = 0; step < kDim / 16; ++step) {
        const uint32_t in_half = (step % 4) * 32;  // 16 BF16 per k step, 4 steps per 128-byte half
        mma_shared(score, descriptor(query_tile + (step / 4) * kQueryHalfBytes + in_half, 16, kRowGroupBytes),
                   descriptor(key_tile + (step / 4) * kTileHalfBytes + in_half, 16, kRowGroupBytes), step > 0);
      }
      mma_commit();
    };
    auto probabilities_values = [&](float(&acc)[64], const uint32_t(&probability)[32], int32_t tile) {
      const uint32_t value_tile = value_tiles + value_stage(tile) * kTileBytes;
  #pragma unroll
      for (int step = 0; step < kKeys / 16; ++step) {
        const uint32_t(&a)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&probability[4 * step]);
        mma_registers(acc, a, descriptor(value_tile + step * 2 * kRowGroupBytes, kTileHalfBytes, kRowGroupBytes));
      }
      mma_commit();
    };

    float acc[64], score[64];
    uint32_t probability[32];
    float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.0f, 0.0f}, correction[2] = {1.0f, 1.0f};
    bool poisoned[2] = {false, false};
  #pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

    // Masks the S tile where some vector of this warp does not see all of it, notes visible missing keys, and
    // releases the K stage (the S wgmma has read it, and the missing-key words are read).
    auto mask = [&](int32_t tile) {
      const int stage = key_stage(tile);
      const uint4 missing = *reinterpret_cast<const uint4*>(missing_keys[stage]);
      const uint32_t words[4] = {missing.x, missing.y, missing.z, missing.w};
      const int32_t tile_start = work.first_key + tile * kKeys, tile_end = tile_start + kKeys - 1;
      if ((missing.x | missing.y | missing.z | missing.w) != 0 || tile_start < lowest_max || tile_end > highest_min) {
  #pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
  #pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e / 2;
            const int32_t t = tile_start + 8 * j + 2 * (lane % 4) + e % 2;
            const bool visible = t >= lowest[h] && t <= highest[h];
            poisoned[h] |= visible && ((words[j / 4] >> (8 * (j % 4) + 2 * (lane % 4) + e % 2)) & 1u) != 0;
            if (!visible) score[4 * j + e] = -INFINITY;
          }
      }
      release(&key_empty[stage]);
    };
    // Online softmax per vector: the 4 lanes of a quad hold one vector's keys. Leaves exp(s - max) in `score` and
    // the factor the accumulators are to be scaled by in `correction`.
    auto softmax = [&]() {
  #pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
  #pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
          tile_max = fmaxf(tile_max, fmaxf(score[4 * j + 2 * h], score[4 * j + 2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(running_max[h], tile_max);
        // While nothing is visible yet the maximum is -inf: subtract 0 instead (every exponent is -inf then).
        const float max_scaled = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
        correction[h] = exp2_ftz(running_max[h] * scale_log2 - max_scaled);
        running_max[h] = new_max;
        float tile_sum = 0.0f;
  #pragma unroll
        for (int j = 0; j < kKeys / 8; ++j)
  #pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            score[4 * j + e] = exp2_ftz(fmaf(score[4 * j + e], scale_log2, -max_scaled));
            tile_sum += score[4 * j + e];
          }
        running_sum[h] = running_sum[h] * correction[h] + tile_sum;
      }
    };
    // P as BF16 A fragments: the S registers of two adjacent 8-key column blocks are one 16-key k step.
    auto round_probabilities = [&]() {
  #pragma unroll
      for (int step = 0; step < kKeys / 16; ++step)
  #pragma unroll
        for (int r = 0; r < 4; ++r)
          probability[4 * step + r] = pack_bf16(score[8 * step + 2 * r], score[8 * step + 2 * r + 1]);
    };
    auto rescale = [&]() {
  #pragma unroll
      for (int h = 0; h < 2; ++h)
        if (__any_sync(0xffffffffu, correction[h] != 1.0f)) {  // the maxima settle after a few tiles
  #pragma unroll
          for (int j = 0; j < kDim / 8; ++j) {
            acc[4 * j + 2 * h] *= correction[h];
            acc[4 * j + 2 * h + 1] *= correction[h];
          }
        }
    };

    // Round r issues S of tile r and P V of tile r - 1; both warpgroups run rounds 0 to `tiles`, passing over the
    // tiles they do not see in the same rounds as the others use them, and take turns to issue (ping-pong:
    // consumer 0 first, each handing the turn over once its wgmmas of the round are issued), so every wait of a
    // round is on the producer's or the other warpgroup's work of earlier rounds.
    auto begin_turn = [&]() {
      asm volatile("bar.sync %0, %1;\n" ::"r"(kSchedulerBarrier + consumer), "n"(2 * kGroupThreads) : "memory");
    };
    auto end_turn = [&](int32_t round) {
      if (consumer == 0 || round < work.tiles)  // consumer 1's first hand-over precedes its rounds: it skips the last
        asm volatile("bar.arrive %0, %1;\n" ::"r"(kSchedulerBarrier + 1 - consumer), "n"(2 * kGroupThreads)
                     : "memory");
    };
    if (consumer == 1) end_turn(-1);
    auto pass_round = [&](int32_t round) {
      if (round < work.tiles) pass_over_keys(round);
      if (round > 0) pass_over_values(round - 1);
      begin_turn();
      end_turn(round);
    };

    if (seen_first <= seen_last) {
      for (int32_t round = 0; round < seen_first; ++round) pass_round(round);
      if (seen_first > 0) pass_over_values(seen_first - 1);
      await_keys(seen_first);
      fence_async_proxy();
      begin_turn();
      mma_fence();
      query_keys(score, seen_first);
      end_turn(seen_first);
      mma_wait<0>();
      pin(score);
      mask(seen_first);
      softmax();
      round_probabilities();
      for (int32_t tile = seen_first + 1; tile <= seen_last; ++tile) {
        // S of this tile and P V of the previous one in flight together; the softmax waits for S only. One proxy
        // fence for both tiles' copies.
        await_keys(tile);
        await_values(tile - 1);
        fence_async_proxy();
        begin_turn();
        mma_fence();
        query_keys(score, tile);
        probabilities_values(acc, probability, tile - 1);
        end_turn(tile);
        mma_wait<1>();
        pin(score);
        mask(tile);
        softmax();
        mma_wait<0>();
        pin(acc);
        release(&value_empty[value_stage(tile - 1)]);
        rescale();
        round_probabilities();
      }
      if (seen_last + 1 < work.tiles) pass_over_keys(seen_last + 1);
      await_values(seen_last);
      fence_async_proxy();
      begin_turn();
      mma_fence();
      probabilities_values(acc, probability, seen_last);
      end_turn(seen_last + 1);
      mma_wait<0>();
      pin(acc);
      release(&value_empty[value_stage(seen_last)]);
      for (int32_t round = seen_last + 2; round <= work.tiles; ++round) pass_round(round);
    } else {
      for (int32_t round = 0; round <= work.tiles; ++round) pass_round(round);
    }

  #pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = running_sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      int poison = poisoned[h];
      poison |= __shfl_xor_sync(0xffffffffu, poison, 1);
      poison |= __shfl_xor_sync(0xffffffffu, poison, 2);
      const int vector = consumer * kGroupVectors + warp * 16 + 8 * h + lane / 4;
      if (vector >= work.vectors) continue;
      const int64_t row = work.first_row + vector / group;
      const int32_t head = work.kv_head * group + vector % group;
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      float* result = out + (row * num_heads + head) * kDim + 2 * (lane % 4);
  #pragma unroll
      for (int j = 0; j < kDim / 8; ++j) {
        float2 value = make_float2(acc[4 * j + 2 * h] * inverse, acc[4 * j + 2 * h + 1] * inverse);
        if (poison != 0) value = make_float2(quiet_nan(), quiet_nan());
        *reinterpret_cast<float2*>(result + 8 * j) = value;
      }
    }
    consumed += work.tiles;
  }
}


}  // namespace

cudaError_t launch_prefill_attention_wgmma(const float* q, const PoolGeometry& pool, int32_t slot,
                                           const BatchGeometry& batch, const int32_t* tile_list, int64_t tiles,
                                           int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                           cudaStream_t stream) {
  if (pool.dtype != DType::BF16) return cudaErrorInvalidValue;
  constexpr size_t bytes = kSharedBytes + kSharedAlignment;
  static const cudaError_t configured = cudaFuncSetAttribute(
      prefill_attention_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (configured != cudaSuccess) return configured;
  // One block per multiprocessor (the shared memory allows no second), each serving items until they run out.
  static const int multiprocessors = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return 0;
    return count;
  }();
  if (multiprocessors <= 0) return cudaErrorInvalidDevice;
  const int64_t items = tiles * pool.num_kv_heads;
  if (items > INT_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(std::min<int64_t>(items, multiprocessors)));
  prefill_attention_wgmma_kernel<<<grid, kThreads, bytes, stream>>>(
      q, pool, slot, batch, tile_list, static_cast<int32_t>(tiles), num_heads, scale, sliding_window, out);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
