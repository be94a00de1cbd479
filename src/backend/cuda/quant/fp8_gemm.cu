// FP8 block-128 GEMMs on Hopper's warpgroup MMAs (W8A8, fp8.h): the dense projections of many rows, the dense
// SwiGLU's gate|up, and the routed experts from two tokens on.
//
// Every GEMM is "swapped" like the BF16 experts' (moe/moe_mma.cu): C^T = W · X^T with the weight rows as the
// MMA's M (streamed by TMA, boxes of 64 rows x 128 k in the 128-byte swizzle, rows and k past the ends zero-filled)
// and a tile of kTokens tokens as N (gathered by cp.async through the tile's slot list into the same swizzle). One
// stage is one 128-wide k block: 128 bytes of every row, so a stage's four k32 MMAs make exactly the partial sum of
// one scale block, and the consumer promotes it into its FP32 total with the weight block's scale times each token's
// scale (DeepGEMM's scheme) before the next block. The producer stages each token's scale of the k block with its
// rows.
//
// A block has two consumer warpgroups and one producer warp. Warpgroup g owns sub-tile g: for gate|up, 64 rows of
// gate (g = 0) and the same 64 rows of up (g = 1), whose totals meet through shared memory for the SwiGLU; else rows
// [128 b, 128 b + 64) and [128 b + 64, 128 b + 128) of one matrix, one weight scale row. The grid is (tile, row
// block) with the row block fastest, so the blocks resident together share a tile's tokens through L2.
#include <cudaTypedefs.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common/async_copy.cuh"
#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/mbarrier.cuh"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/quant/fp8.h"
#include "backend/cuda/quant/wgmma_e4m3.cuh"

namespace beamline::cuda::fp8 {
namespace {

constexpr int kBoxRows = 64;                    // one wgmma's M, one TMA box's rows
constexpr int kRowBytes = static_cast<int>(kBlock);  // one k block of one row: a 128-byte swizzle row
constexpr int kBoxBytes = kBoxRows * kRowBytes;
constexpr int kSwizzleBytes = 1024;             // the swizzle pattern's period (8 rows) and alignment
constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 32;
constexpr int kMmaK = 32;                       // k of one FP8 wgmma: 32 bytes along the swizzled rows

template <int kTokens>
struct Tiling {
  static_assert(kTokens % 8 == 0 && kTokens >= 8 && kTokens <= 128, "wgmma's N, in the wrappers made");
  static constexpr int kFragment = kTokens / 2;  // accumulators per thread of one 64 x kTokens wgmma
  // Two blocks per SM while the accumulators (total and partial, kTokens floats) leave registers for it.
  static constexpr int kBlocksPerSm = kTokens >= 128 ? 1 : 2;
  static constexpr int kTokenBytes = kTokens * kRowBytes;
  static constexpr int kStageBytes = 2 * kBoxBytes + kTokenBytes;
  static constexpr int kScaleBytes = kTokens * 4;  // the tokens' scales of the stage's k block
  static constexpr size_t kBudget = kBlocksPerSm == 1 ? 200 * 1024 : 100 * 1024;
  static constexpr int kStages = std::min<int>(8, static_cast<int>(kBudget / (kStageBytes + kScaleBytes)));
  static constexpr size_t kScaleOffset = size_t{kStages} * kStageBytes;
  static constexpr size_t kSharedBytes = kScaleOffset + size_t{kStages} * kScaleBytes + kSwizzleBytes;
  static_assert(kStageBytes % kSwizzleBytes == 0, "every operand tile starts on a swizzle period");
  static_assert(kStages >= 3, "the pipeline needs a stage in use and two in flight");
  // The SwiGLU exchange (up's totals, one float per accumulator and thread) reuses the stages.
  static_assert(size_t{kFragment} * 128 * 4 <= kScaleOffset, "the exchange fits in the stages");
};

struct GemmArgs {
  const uint8_t* x = nullptr;       // [*, k] E4M3
  const float* x_scale = nullptr;   // [*, ceil(k / 128)]
  const int32_t* grouped = nullptr; // slots grouped by expert; null: dense, slot = token row
  const int32_t* tiles = nullptr;   // (expert, first, count, unused) per tile; null: dense
  int32_t top_k = 1;                // X row of a slot: slot / top_k
  int64_t tokens = 0;               // dense: rows of X and of the output
  const unsigned char* maps[2] = {};        // per expert, of the sub-tiles' matrices; null: the kernel's map params
  const float* const* scale_table[2] = {};  // per expert; null: dense_scale
  const float* dense_scale[2] = {};
  const float* weights = nullptr;   // routing weight per slot (the down GEMM); null: 1
  int64_t m = 0, k = 0;             // weight rows, reduction length
  unsigned int row_blocks = 0;
  float* out = nullptr;             // [slot, m] F32
  float softcap = 0.0f;
};

__device__ __forceinline__ void arrive_expecting(uint64_t* barrier, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

// Rows [row, row + 64) x bytes [k0, k0 + 128) of the matrix behind `map` into `shared`, counted on `barrier`.
__device__ __forceinline__ void load_box(uint32_t shared, const void* map, int32_t k0, int32_t row, uint64_t* barrier,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(shared),
      "l"(map), "r"(k0), "r"(row), "r"(shared_address(barrier)), "l"(policy)
      : "memory");
}

// 4 bytes from `global` to the shared address `shared`; zeros when !valid.
__device__ __forceinline__ void copy_async4(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 4 : 0));
}

// A K-major operand in the 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t matrix_descriptor(uint32_t shared) {
  constexpr uint64_t kGroupStride = kSwizzleBytes >> 4, kSwizzle128 = 1;
  return uint64_t{(shared & 0x3ffffu) >> 4} | uint64_t{1} << 16 | kGroupStride << 32 | kSwizzle128 << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keeps the compiler from moving accesses of accumulators across the asynchronous MMAs that write them.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The two consumer warpgroups, and no other thread.
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

template <int kTokens, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, Tiling<kTokens>::kBlocksPerSm)
    gemm_kernel(const __grid_constant__ CUtensorMap map0, const __grid_constant__ CUtensorMap map1, GemmArgs args) {
  using T = Tiling<kTokens>;
  constexpr int kStages = T::kStages, kFragment = T::kFragment;
  extern __shared__ unsigned char shared[];
  __shared__ int32_t source_row[kTokens], slot_of[kTokens];
  __shared__ uint64_t full[kStages], empty[kStages];

  const unsigned int tile_index = blockIdx.x / args.row_blocks;
  int32_t expert = 0, first = 0, count = 0;
  if (args.tiles != nullptr) {
    expert = args.tiles[4 * tile_index];
    if (expert < 0) return;
    first = args.tiles[4 * tile_index + 1];
    count = args.tiles[4 * tile_index + 2];
  } else {
    first = static_cast<int32_t>(tile_index * kTokens);
    count = static_cast<int32_t>(min(int64_t{kTokens}, args.tokens - first));
  }
  const int64_t row0 = int64_t{blockIdx.x % args.row_blocks} * (kSwiglu ? kBoxRows : 2 * kBoxRows);
  const int64_t sub_row0[2] = {row0, kSwiglu ? row0 : row0 + kBoxRows};
  for (int n = threadIdx.x; n < kTokens; n += kThreads) {
    const int32_t slot = n >= count ? -1 : args.grouped != nullptr ? args.grouped[first + n] : first + n;
    slot_of[n] = slot;
    source_row[n] = slot < 0 ? -1 : slot / args.top_k;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      init_mbarrier(&full[s], 32 + 1);  // each producer lane's copies, and the arrival that expects the TMA bytes
      init_mbarrier(&empty[s], kConsumerThreads / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();

  const uint32_t stages = (shared_address(shared) + kSwizzleBytes - 1) & ~uint32_t{kSwizzleBytes - 1};
  const uint32_t scales = stages + static_cast<uint32_t>(T::kScaleOffset);
  const int64_t k = args.k, k_blocks = blocks_of(k);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);

  if (warp == kConsumerThreads / 32) {  // the producer
    const void* map[2] = {&map0, &map1};
    if (args.maps[0] != nullptr) {
      map[0] = args.maps[0] + kTensorMapBytes * expert;
      map[1] = args.maps[1] + kTensorMapBytes * expert;
    }
    if (lane < 2) asm volatile("prefetch.tensormap [%0];\n" ::"l"(lane == 0 ? map[0] : map[1]) : "memory");
    // A weight box is read by one tile's row block alone; the tokens are re-read by the tile's other row blocks.
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    const int token_copies = count * (kRowBytes / 16);  // 16-byte pieces of the staged token rows
    for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
      const int stage = static_cast<int>(k_block % kStages);
      wait_mbarrier(&empty[stage], (static_cast<uint32_t>(k_block / kStages) & 1) ^ 1);
      const uint32_t base = stages + stage * T::kStageBytes;
      const auto k0 = static_cast<int32_t>(k_block * kBlock);
      if (lane == 0) {
        arrive_expecting(&full[stage], 2 * kBoxBytes);
#pragma unroll
        for (int sub = 0; sub < 2; ++sub)
          load_box(base + sub * kBoxBytes, map[sub], k0, static_cast<int32_t>(sub_row0[sub]), &full[stage], policy);
      }
      // Token n's 16-byte piece c goes to piece c ^ (n % 8) of its 128-byte row: the swizzle TMA gives the weights.
      // Columns past the tile's count are not staged: each MMA column depends on its own token row alone, and those
      // columns are never stored.
      for (int i = lane; i < token_copies; i += 32) {
        const int n = i / (kRowBytes / 16), piece = i % (kRowBytes / 16);
        const int64_t kk = k0 + piece * 16;
        const bool valid = kk < k;
        copy_async16(base + 2 * kBoxBytes + n * kRowBytes + ((piece ^ (n % 8)) * 16),
                     valid ? args.x + int64_t{source_row[n]} * k + kk : args.x, valid);
      }
      for (int n = lane; n < count; n += 32)
        copy_async4(scales + stage * T::kScaleBytes + n * 4, args.x_scale + int64_t{source_row[n]} * k_blocks + k_block,
                    true);
      arrive_mbarrier_when_copied(&full[stage]);
    }
    return;
  }

  // The consumers: warpgroup `group` owns sub-tile `group`.
  const int group = warp / 4, thread = static_cast<int>(threadIdx.x % 128);
  // (Selected by comparisons: an array indexed by a run-time value would go to local memory.)
  const int64_t my_row0 = group == 0 ? sub_row0[0] : sub_row0[1];
  const bool rows_exist = my_row0 < args.m;
  const float* const* scale_table = group == 0 ? args.scale_table[0] : args.scale_table[1];
  const float* weight_scale =
      (scale_table != nullptr ? scale_table[expert] : group == 0 ? args.dense_scale[0] : args.dense_scale[1]) +
      (my_row0 / kBlock) * k_blocks;
  const auto* token_scales = reinterpret_cast<const float*>(shared + (scales - shared_address(shared)));
  float total[kFragment], partial[kFragment];
#pragma unroll
  for (int i = 0; i < kFragment; ++i) total[i] = partial[i] = 0.0f;
  for (int64_t k_block = 0; k_block < k_blocks; ++k_block) {
    const int stage = static_cast<int>(k_block % kStages);
    const float block_scale = rows_exist ? __ldg(weight_scale + k_block) : 0.0f;
    wait_mbarrier(&full[stage], static_cast<uint32_t>(k_block / kStages) & 1);
    // The token rows were written by cp.async (the generic proxy); wgmma reads them through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    const uint32_t base = stages + stage * T::kStageBytes;
    fence_accumulators(partial);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kRowBytes / kMmaK; ++kk)
      wgmma_e4m3(partial, matrix_descriptor(base + group * kBoxBytes + kk * kMmaK),
                 matrix_descriptor(base + 2 * kBoxBytes + kk * kMmaK), kk > 0 ? 1u : 0u);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(partial);
    // Accumulator i: row (warp % 4) * 16 + lane / 4 (+8 when i % 4 >= 2), token (i / 4) * 8 + (lane % 4) * 2 (+1 for
    // odd i). Promote with the weight block's scale times the token's.
    const float* stage_scales = token_scales + stage * kTokens;
#pragma unroll
    for (int i = 0; i < kFragment; i += 2) {
      const int n = (i / 4) * 8 + (lane % 4) * 2;
      const float2 token_scale = *reinterpret_cast<const float2*>(stage_scales + n);
      total[i] = fmaf(partial[i], block_scale * token_scale.x, total[i]);
      total[i + 1] = fmaf(partial[i + 1], block_scale * token_scale.y, total[i + 1]);
    }
    __syncwarp();
    if (lane == 0) arrive_mbarrier(&empty[stage]);
  }

  const int row_in_tile = (warp % 4) * 16 + lane / 4;
  if constexpr (kSwiglu) {
    // Up's totals to gate's threads, through the stages (every stage has been read: both warpgroups are past their
    // last wait, and nothing refills them).
    auto* exchange = reinterpret_cast<float*>(shared + (stages - shared_address(shared)));
    consumers_sync();
    if (group == 1)
#pragma unroll
      for (int i = 0; i < kFragment; ++i) exchange[i * 128 + thread] = total[i];
    consumers_sync();
    if (group == 1) return;
#pragma unroll
    for (int i = 0; i < kFragment; ++i) {
      const int n = (i / 4) * 8 + (lane % 4) * 2 + (i & 1);
      const int64_t row = sub_row0[0] + row_in_tile + ((i % 4) >= 2 ? 8 : 0);
      if (n < count && row < args.m)
        args.out[int64_t{slot_of[n]} * args.m + row] = silu(total[i]) * exchange[i * 128 + thread];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kFragment; ++i) {
      const int n = (i / 4) * 8 + (lane % 4) * 2 + (i & 1);
      const int64_t row = my_row0 + row_in_tile + ((i % 4) >= 2 ? 8 : 0);
      if (n >= count || row >= args.m) continue;
      const int64_t slot = slot_of[n];
      float value = total[i];
      if (args.weights != nullptr) value *= args.weights[slot];
      if (args.softcap > 0.0f) value = args.softcap * tanhf(value / args.softcap);
      args.out[slot * args.m + row] = value;
    }
  }
}

// Once per process and configuration, outside any graph capture's stream work: more than 48 KiB per block.
template <int kTokens, bool kSwiglu>
cudaError_t configure() {
  static const cudaError_t status = cudaFuncSetAttribute(
      gemm_kernel<kTokens, kSwiglu>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(Tiling<kTokens>::kSharedBytes));
  return status;
}

template <int kTokens, bool kSwiglu>
cudaError_t launch(const CUtensorMap& map0, const CUtensorMap& map1, const GemmArgs& args, int64_t tiles,
                   cudaStream_t stream) {
  if (cudaError_t status = configure<kTokens, kSwiglu>(); status != cudaSuccess) return status;
  const int64_t blocks = tiles * args.row_blocks;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  gemm_kernel<kTokens, kSwiglu><<<static_cast<unsigned int>(blocks), kThreads, Tiling<kTokens>::kSharedBytes, stream>>>(
      map0, map1, args);
  return cudaGetLastError();
}

// The token tile of a GEMM over `rows` rows (dense) or of an expert with about `rows` slots: the smallest N that
// holds them, at most 128.
int32_t tile_tokens(int64_t rows) {
  for (int32_t n : {8, 16, 32, 64}) if (rows <= n) return n;
  return 128;
}

template <bool kSwiglu>
cudaError_t launch_tiles(int32_t tokens, const CUtensorMap& map0, const CUtensorMap& map1, const GemmArgs& args,
                         int64_t tiles, cudaStream_t stream) {
  switch (tokens) {
    case 8: return launch<8, kSwiglu>(map0, map1, args, tiles, stream);
    case 16: return launch<16, kSwiglu>(map0, map1, args, tiles, stream);
    case 32: return launch<32, kSwiglu>(map0, map1, args, tiles, stream);
    case 64: return launch<64, kSwiglu>(map0, map1, args, tiles, stream);
    case 128: return launch<128, kSwiglu>(map0, map1, args, tiles, stream);
    default: return cudaErrorInvalidValue;
  }
}

CUtensorMap encode_map(const void* weight, int64_t rows, int64_t cols, cudaError_t& status) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof map);
  status = encode_weight_map(weight, rows, cols, &map);
  return map;
}

}  // namespace

cudaError_t encode_weight_map(const void* weight, int64_t rows, int64_t cols, void* map) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  static const Encode encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return Encode{nullptr};
    return reinterpret_cast<Encode>(function);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (!gemm_supported(cols) || reinterpret_cast<uintptr_t>(weight) % 16 != 0) return cudaErrorInvalidValue;
  static_assert(sizeof(CUtensorMap) == kTensorMapBytes, "the tensor map tables' stride");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_stride[1] = {static_cast<cuuint64_t>(cols)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kRowBytes), kBoxRows}, element_strides[2] = {1, 1};
  CUtensorMap encoded;
  const CUresult result =
      encode(&encoded, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(weight), dims, row_stride, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) return cudaErrorInvalidValue;
  std::memcpy(map, &encoded, sizeof(encoded));
  return cudaSuccess;
}

bool gemm_supported(int64_t in) { return in > 0 && in % 16 == 0; }

cudaError_t linear(const uint8_t* xq, const float* xs, int64_t rows, int64_t in, const void* weight,
                   const float* weight_scale, int64_t out, float softcap, float* y, cudaStream_t stream) {
  if (rows == 0 || out == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const CUtensorMap map = encode_map(weight, out, in, status);
  if (status != cudaSuccess) return status;
  GemmArgs args;
  args.x = xq;
  args.x_scale = xs;
  args.tokens = rows;
  args.dense_scale[0] = args.dense_scale[1] = weight_scale;
  args.m = out;
  args.k = in;
  args.row_blocks = blocks_for(out, 2 * kBoxRows);
  args.out = y;
  args.softcap = softcap;
  const int32_t tokens = tile_tokens(rows);
  return launch_tiles<false>(tokens, map, map, args, (rows + tokens - 1) / tokens, stream);
}

cudaError_t gate_up(const uint8_t* xq, const float* xs, int64_t rows, int64_t in, const void* gate,
                    const float* gate_scale, const void* up, const float* up_scale, int64_t inter, float* activated,
                    cudaStream_t stream) {
  if (rows == 0 || inter == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const CUtensorMap gate_map = encode_map(gate, inter, in, status);
  if (status != cudaSuccess) return status;
  const CUtensorMap up_map = encode_map(up, inter, in, status);
  if (status != cudaSuccess) return status;
  GemmArgs args;
  args.x = xq;
  args.x_scale = xs;
  args.tokens = rows;
  args.dense_scale[0] = gate_scale;
  args.dense_scale[1] = up_scale;
  args.m = inter;
  args.k = in;
  args.row_blocks = blocks_for(inter, kBoxRows);
  args.out = activated;
  const int32_t tokens = tile_tokens(rows);
  return launch_tiles<true>(tokens, gate_map, up_map, args, (rows + tokens - 1) / tokens, stream);
}

bool moe_supported(int32_t experts, int64_t hidden, int64_t intermediate) {
  return experts >= 1 && experts <= kMaxMmaExperts && hidden % 16 == 0 && intermediate % 16 == 0 && hidden > 0 &&
         intermediate > 0;
}

int64_t moe_max_tiles(int64_t assignments, int32_t experts) { return moe_tile_bound(assignments, experts, 8); }

cudaError_t moe(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                const Experts& experts, const MoeWorkspace& workspace, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int64_t assignments = rows * top_k;
  if (!moe_supported(experts.experts, experts.hidden, experts.intermediate) || assignments > INT32_MAX ||
      workspace.max_tiles < moe_max_tiles(assignments, experts.experts))
    return cudaErrorInvalidValue;
  const int64_t hidden = experts.hidden, inter = experts.intermediate;
  if (cudaError_t status = quantize_rows(h, rows, hidden, workspace.h_q, workspace.h_scale, stream);
      status != cudaSuccess)
    return status;
  // Tiles of about twice the average slots per expert, so that few experts spill into a second tile (which streams
  // their weights again).
  const int32_t tokens = tile_tokens(std::max<int64_t>(1, 2 * assignments / experts.experts));
  const int64_t tiles = moe_tile_bound(assignments, experts.experts, tokens);
  if (cudaError_t status = moe_group_slots(ids, assignments, experts.experts, tokens, tiles, workspace.grouped,
                                           workspace.tiles, stream);
      status != cudaSuccess)
    return status;
  const CUtensorMap unused{};
  GemmArgs up;
  up.x = workspace.h_q;
  up.x_scale = workspace.h_scale;
  up.grouped = workspace.grouped;
  up.tiles = workspace.tiles;
  up.top_k = top_k;
  up.maps[0] = experts.maps[0];
  up.maps[1] = experts.maps[1];
  up.scale_table[0] = experts.scale[0];
  up.scale_table[1] = experts.scale[1];
  up.m = inter;
  up.k = hidden;
  up.row_blocks = blocks_for(inter, kBoxRows);
  up.out = workspace.activated;
  if (cudaError_t status = launch_tiles<true>(tokens, unused, unused, up, tiles, stream); status != cudaSuccess)
    return status;
  if (cudaError_t status = quantize_rows(workspace.activated, assignments, inter, workspace.activated_q,
                                         workspace.activated_scale, stream);
      status != cudaSuccess)
    return status;
  GemmArgs down;
  down.x = workspace.activated_q;
  down.x_scale = workspace.activated_scale;
  down.grouped = workspace.grouped;
  down.tiles = workspace.tiles;
  down.top_k = 1;
  down.maps[0] = down.maps[1] = experts.maps[2];
  down.scale_table[0] = down.scale_table[1] = experts.scale[2];
  down.weights = weights;
  down.m = hidden;
  down.k = inter;
  down.row_blocks = blocks_for(hidden, 2 * kBoxRows);
  down.out = workspace.expert_out;
  if (cudaError_t status = launch_tiles<false>(tokens, unused, unused, down, tiles, stream); status != cudaSuccess)
    return status;
  return moe_combine(workspace.expert_out, ids, rows, top_k, experts.experts, hidden, out, stream);
}

}  // namespace beamline::cuda::fp8
