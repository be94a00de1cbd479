#pragma once
// One token's routed experts with the weights staged through shared memory (decode at batch 1; the default version
// of token_moe.cuh's family, BEAMLINE_CUDA_TOKEN_MOE=ring and =legacy select the register versions there).
//
// Why: the register versions hold their loads in flight in registers, 4-8 KiB a warp, and a single wave of 1,280
// warps (~10 per multiprocessor) leaves ~40-80 KiB in flight per multiprocessor: 2.6-2.8 TB/s measured. Here each warp
// streams its 32 weight rows (two tiles of 16) through a ring of 4 stages (StagedShape) in shared memory with cp.async:
// a stage is 128 bytes of every row (4 KiB), three stages are in flight while the fourth is read (12 KiB a warp, ~120
// KiB a multiprocessor, registers free of loads), and one warp copy instruction reads 4 rows x 128 contiguous bytes.
// The warp's lanes then read their mma fragments out of the stage exactly as the register versions took them from
// their loads (the format's Reader does that and the dequantization), so the numerics are theirs.
//
// Grid (StagedShape, the default): blocks of 5 warps, two blocks per multiprocessor (shared memory), so that Beam-1.0's
// 8 x 2560 gate|up rows and 8 x 5120 down rows of one token are one wave each of 256 blocks on 132 multiprocessors.
// More tokens (MXFP8, NVFP4) are more waves along z, each token reading its own experts.
//  - gate|up: block (x, j, t) = 5 x 16 intermediate rows of gate and up of token t's routed expert j, SwiGLU fused.
//  - down: block (x, j, t) = 5 x 32 output rows of routed expert j (its own activation split only: the splits of all
//    eight experts in every block took 82 KB and left room for one block); each writes its dots to `partial`, and the
//    last of a row range's top_k blocks to arrive (an atomic counter) sums them in j order into out: the combine
//    without a launch, in the order the other versions use.
//  - both passes are launched as programmatic dependents (PDL): gate|up's blocks are resident while the route
//    finishes (they wait before reading anything), and down's blocks copy their first stages of weights before they
//    wait for gate|up.
// BEAMLINE_CUDA_TOKEN_MOE=staged-wide and =staged-wide5 select other shapes (StagedShape), for the GPU to rank:
// one block of 10 warps per multiprocessor (128 blocks a pass at Beam-1.0: 4 multiprocessors idle instead of 8 with
// one block of two) holds one copy of the activation split instead of two, and with it 4 stages a warp (as now) or
// 5 (4 in flight: 160 KiB a multiprocessor instead of 120). Widths whose shared memory a shape does not fit take the
// default shape (staged-wide5 at Beam-1.0's: FP8, MXFP8 and BF16 fit, NVFP4's stages with their scales do not).
//
// A Reader (quant/fp8_token_moe.cu, quant/micro_rows.cu) has:
//   using Operand;                          the activation operand: bytes(k), at(base, k) -> View, write(...)
//   static constexpr int kStageK;           k columns in a stage (128 bytes of a row)
//   static constexpr int kScaleBytes;       scale bytes a stage holds for the warp's 32 rows (a multiple of 16)
//   static Reader make(experts, e, matrix[2], first_row[2], rows, k)
//   int64_t row_bytes() const;              bytes of one weight row
//   const uint8_t* row_codes(i, t) const;   row first_row[i] + t of tile i (clamped to the last row)
//   void copy_scales(stage, target, lane)   issues the stage's scale copies (cp.async) into target
//   void consume(codes, scales, stage, view, lane, total)
//                                           adds the stage's products: total[i][0] row g, [i][1] row g + 8 of tile i,
//                                           in lanes c = 0; row t of the stage at codes + 128 t, its 16-byte chunk q
//                                           at position q ^ stage_swizzle(t)
//   void finish(total) const;               per-tensor factors (NVFP4's scale_2)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/common/async_copy.cuh"
#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/quant/activation_split.cuh"
#include "backend/cuda/quant/token_moe.cuh"
#include "backend/cuda/quant/token_moe.h"

namespace beamline::cuda {

constexpr int kStageRowBytes = 128;
constexpr int kStagedRows = 2 * kTokenTileRows;                  // weight rows per warp: two mma tiles
constexpr int kStageCodeBytes = kStagedRows * kStageRowBytes;    // 4 KiB
constexpr int kStageCopies = kStageCodeBytes / 16 / 32;          // 16-byte copies per lane and stage

// Warps per block, stages per warp's ring and blocks per multiprocessor of the staged kernels; a down block's output
// rows (kWarps x 32) are its combine unit, one row per thread.
template <int kWarpsPerBlock, int kRingStages, int kBlocks>
struct StagedShape {
  static constexpr int kWarps = kWarpsPerBlock, kStages = kRingStages, kBlocksPerSm = kBlocks;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int64_t kCombineRows = int64_t{kWarps} * kStagedRows;
  static_assert(kCombineRows % kTokenMoeCombineRows == 0, "token_moe_counters(H) counters cover the combine units");
};
using DefaultStagedShape = StagedShape<5, 4, 2>;
using WideStagedShape = StagedShape<10, 4, 1>;
using DeepWideStagedShape = StagedShape<10, 5, 1>;
static_assert(DefaultStagedShape::kCombineRows == kTokenMoeCombineRows, "the smallest combine unit sizes the counters");

// The stage position of row t's 16-byte chunk q is q ^ stage_swizzle(t): the lanes of one shared load then hit
// distinct banks, for 16-byte reads (lanes g, g + 1 read chunks 4u..4u+3) and 8-byte ones (g..g+3 read 2v, 2v + 1).
__host__ __device__ constexpr int stage_swizzle(int t) { return ((t & 1) << 2) | (t & 2); }

// The F16 split of the activations (activation_split.cuh): the operand of the FP8, MXFP8 and NVFP4 readers, its
// groups paired for the words a reader decodes by cvt (kWords).
template <CvtWords kWords = CvtWords::None>
struct SplitOperand {
  using View = Split;
  static __host__ __device__ int64_t bytes(int64_t k) { return split_bytes(k); }
  static __device__ View at(void* base, int64_t k) { return split_at(base, k); }
  static __device__ void write(const float* x, int64_t k, const View& view, int first, int stride, int lane) {
    split_activations<kWords>(x, k, view, first, stride, lane);
  }
};
// Whether a reader with this operand decodes words by cvt (BEAMLINE_CUDA_TOKEN_MOE=staged-cvt, =staged-half-cvt).
template <class Operand>
struct DecodesByCvt : std::false_type {};
template <CvtWords kWords>
struct DecodesByCvt<SplitOperand<kWords>> : std::bool_constant<kWords != CvtWords::None> {};

template <class Reader>
constexpr int stage_bytes() {
  static_assert(Reader::kScaleBytes % 16 == 0, "stages stay 16-byte aligned");
  return kStageCodeBytes + Reader::kScaleBytes;
}
template <class Reader, class Shape>
constexpr int64_t staged_shared_bytes(int64_t operand_k) {
  return Reader::Operand::bytes(operand_k) + int64_t{Shape::kWarps} * Shape::kStages * stage_bytes<Reader>();
}

// One lane's share of the copies: 16-byte chunk lane % 8 of rows lane / 8 + 4m (m < 8), for every stage.
template <class Reader>
struct StagedCopies {
  const uint8_t* source[kStageCopies];
  uint32_t target[kStageCopies];
  int64_t row_bytes;
  int stages;

  __device__ StagedCopies(const Reader& reader, int64_t k, int lane) {
    row_bytes = reader.row_bytes();
    stages = static_cast<int>((k + Reader::kStageK - 1) / Reader::kStageK);
#pragma unroll
    for (int m = 0; m < kStageCopies; ++m) {
      const int t = lane / 8 + 4 * m;  // row t % 16 of tile m / 4 (a constant: tiles are picked without an index)
      source[m] = reader.row_codes(m / 4, t % kTokenTileRows) + 16 * (lane % 8);
      target[m] = static_cast<uint32_t>(t * kStageRowBytes + 16 * ((lane % 8) ^ stage_swizzle(t)));
    }
  }

  // Stage `stage` into `slot`, one commit group (empty past the last stage).
  __device__ __forceinline__ void copy(const Reader& reader, int stage, unsigned char* slot, int lane) const {
    if (stage < stages) {
      const int64_t offset = int64_t{stage} * kStageRowBytes;
      const bool valid = offset + 16 * (lane % 8) < row_bytes;  // chunks past the row: zeros
#pragma unroll
      for (int m = 0; m < kStageCopies; ++m) copy_async16(slot + target[m], source[m] + offset, valid);
      reader.copy_scales(stage, slot + kStageCodeBytes, lane);
    }
    commit_copies();
  }
};

template <class Reader, int kStages>
__device__ __forceinline__ void staged_prologue(const Reader& reader, const StagedCopies<Reader>& copies,
                                                unsigned char* ring, int lane) {
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) copies.copy(reader, p, ring + p * stage_bytes<Reader>(), lane);
}

// The warp's dots over every stage, after staged_prologue: stage s + kStages - 1 is issued into the slot read at
// s - 1, then stage s is awaited and read.
template <class Reader, int kStages>
__device__ __forceinline__ void staged_dot(const Reader& reader, const StagedCopies<Reader>& copies,
                                           unsigned char* ring, const typename Reader::Operand::View& operand,
                                           int lane, float (&total)[2][2]) {
  constexpr int kBytes = stage_bytes<Reader>();
  int slot = 0, refill = kStages - 1;
  for (int s = 0; s < copies.stages; ++s) {
    __syncwarp();  // every lane has read the slot about to be refilled
    copies.copy(reader, s + kStages - 1, ring + refill * kBytes, lane);
    wait_copies<kStages - 1>();
    __syncwarp();  // and every lane's copies of stage s have landed
    reader.consume(ring + slot * kBytes, ring + slot * kBytes + kStageCodeBytes, s, operand, lane, total);
    slot = slot + 1 == kStages ? 0 : slot + 1;
    refill = refill + 1 == kStages ? 0 : refill + 1;
  }
  reader.finish(total);
}

// activated[t, j, i] = silu(gate_e[i] · h[t]) * (up_e[i] · h[t]) for e = ids[t, j], j = blockIdx.y, token t =
// blockIdx.z; also zeroes the down pass's counters. An unknown expert reads expert 0 and writes zeros (the combine
// makes the token NaN).
template <class Reader, class Shape, class Experts>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kBlocksPerSm)
    staged_gate_up_kernel(const float* __restrict__ h, const int32_t* __restrict__ ids, int32_t top_k, Experts experts,
                          float* __restrict__ activated, int32_t* __restrict__ counters, int32_t counter_count) {
  extern __shared__ __align__(16) unsigned char token_shared[];
  // Everything before this kernel (the route writing ids, whatever wrote h) is complete past this point.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
    for (int i = static_cast<int>(threadIdx.x); i < counter_count; i += Shape::kThreads) counters[i] = 0;
  const int64_t hidden = experts.hidden, inter = experts.intermediate;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32), g = lane / 4;
  const int64_t slot = int64_t{blockIdx.z} * top_k + blockIdx.y;
  const int32_t id = ids[slot];
  const bool known = id >= 0 && id < experts.experts;
  const int64_t tile = (int64_t{blockIdx.x} * Shape::kWarps + warp) * kTokenTileRows;
  const Reader reader = Reader::make(experts, known ? id : 0, {0, 1}, {tile, tile}, inter, hidden);
  const StagedCopies<Reader> copies(reader, hidden, lane);
  unsigned char* ring = token_shared + Reader::Operand::bytes(hidden) + warp * Shape::kStages * stage_bytes<Reader>();
  if (tile < inter) staged_prologue<Reader, Shape::kStages>(reader, copies, ring, lane);  // before the split
  const auto operand = Reader::Operand::at(token_shared, hidden);
  Reader::Operand::write(h + blockIdx.z * hidden, hidden, operand, warp, Shape::kWarps, lane);
  __syncthreads();
  if (tile >= inter) return;
  float total[2][2] = {};
  staged_dot<Reader, Shape::kStages>(reader, copies, ring, operand, lane, total);
  if (lane % 4 != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = tile + g + 8 * r;
    if (row < inter) activated[slot * inter + row] = known ? silu(total[0][r]) * total[1][r] : 0.0f;
  }
}

// partial[t, j, n] = down_{ids[t, j]}[n] · activated[t, j] for the block's rows n (token t = blockIdx.z); the last of
// the token's top_k blocks of a row range to arrive then writes out[t, n] = sum over j in order of
// weights[t, j] * partial[t, j, n] (NaN when an id is out of range).
template <class Reader, class Shape, class Experts>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kBlocksPerSm)
    staged_down_kernel(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                       const float* __restrict__ weights, int32_t top_k, Experts experts, float* __restrict__ partial,
                       int32_t* __restrict__ counters, float* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char token_shared[];
  __shared__ bool last;
  const int64_t hidden = experts.hidden, inter = experts.intermediate;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32), g = lane / 4;
  const int64_t token = blockIdx.z, slot = token * top_k + blockIdx.y;
  ids += token * top_k;
  weights += token * top_k;
  // ids were complete before any gate|up block passed its wait, and every one had before this grid started; read
  // past L1 all the same.
  const int32_t id = __ldcg(ids + blockIdx.y);
  const int64_t first_row = (int64_t{blockIdx.x} * Shape::kWarps + warp) * kStagedRows;
  const Reader reader = Reader::make(experts, id >= 0 && id < experts.experts ? id : 0, {2, 2},
                                     {first_row, first_row + kTokenTileRows}, hidden, inter);
  const StagedCopies<Reader> copies(reader, inter, lane);
  unsigned char* ring = token_shared + Reader::Operand::bytes(inter) + warp * Shape::kStages * stage_bytes<Reader>();
  // Weights do not depend on gate|up: their first stages are copied before the wait.
  if (first_row < hidden) staged_prologue<Reader, Shape::kStages>(reader, copies, ring, lane);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the gate|up pass is done
  const auto operand = Reader::Operand::at(token_shared, inter);
  Reader::Operand::write(activated + slot * inter, inter, operand, warp, Shape::kWarps, lane);
  __syncthreads();
  if (first_row < hidden) {
    float total[2][2] = {};
    staged_dot<Reader, Shape::kStages>(reader, copies, ring, operand, lane, total);
    if (lane % 4 == 0)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = first_row + kTokenTileRows * t + g + 8 * r;
          if (row < hidden) partial[slot * hidden + row] = total[t][r];
        }
  }
  __threadfence();  // this block's partials are visible before its arrival counts
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + token * gridDim.x + blockIdx.x, 1) == top_k - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t row = int64_t{blockIdx.x} * Shape::kCombineRows + threadIdx.x;
  if (row >= hidden) return;
  float sum = 0.0f;
  bool valid = true;
  for (int32_t k = 0; k < top_k; ++k) {
    const int32_t e = __ldcg(ids + k);
    valid = valid && e >= 0 && e < experts.experts;
    sum += __ldcg(weights + k) * __ldcg(partial + (token * top_k + k) * hidden + row);
  }
  out[token * hidden + row] = valid ? sum : __int_as_float(0x7fc00000);
}

// Whether a shape of the staged kernels takes these widths: their shared memory within the per-block limit (the down
// pass's beside its static flag).
constexpr int kStagedDownStaticBytes = 16;
template <class Reader, class Shape>
bool staged_shape_fits(int64_t hidden, int64_t intermediate, int32_t top_k) {
  return top_k >= 1 && top_k <= kTokenMaxTopK && staged_shared_bytes<Reader, Shape>(hidden) <= kTokenMaxSharedBytes &&
         staged_shared_bytes<Reader, Shape>(intermediate) + kStagedDownStaticBytes <= kTokenMaxSharedBytes;
}
// Whether the staged kernels take these widths (in the default shape; another shape falls back to it).
template <class Reader>
bool staged_token_moe_fits(int64_t hidden, int64_t intermediate, int32_t top_k) {
  return staged_shape_fits<Reader, DefaultStagedShape>(hidden, intermediate, top_k);
}

// The two launches in one shape.
template <class Reader, class Shape, class Experts>
cudaError_t launch_staged_shape(const float* h, const int32_t* ids, const float* weights, int32_t tokens,
                                int32_t top_k, const Experts& experts, const TokenMoeScratch& scratch, float* out,
                                cudaStream_t stream) {
  constexpr auto gate_up = staged_gate_up_kernel<Reader, Shape, Experts>;
  constexpr auto down = staged_down_kernel<Reader, Shape, Experts>;
  static const cudaError_t allowed = [] {
    const cudaError_t status =
        cudaFuncSetAttribute(gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize, kTokenMaxSharedBytes);
    return status != cudaSuccess ? status
                                 : cudaFuncSetAttribute(down, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        kTokenMaxSharedBytes - kStagedDownStaticBytes);
  }();
  if (allowed != cudaSuccess) return allowed;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Shape::kThreads);
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = 1;
  if (tokens < 1 || tokens > kTokenMoeMaxTokens) return cudaErrorInvalidValue;
  const auto units = static_cast<unsigned int>((experts.hidden + Shape::kCombineRows - 1) / Shape::kCombineRows);
  const auto slots = static_cast<unsigned int>(top_k), rows = static_cast<unsigned int>(tokens);
  config.gridDim = dim3(blocks_for(experts.intermediate, Shape::kWarps * kTokenTileRows), slots, rows);
  config.dynamicSmemBytes = static_cast<size_t>(staged_shared_bytes<Reader, Shape>(experts.hidden));
  if (cudaError_t status = cudaLaunchKernelEx(&config, gate_up, h, ids, top_k, experts, scratch.activated,
                                              scratch.counters, static_cast<int32_t>(units * rows));
      status != cudaSuccess)
    return status;
  config.gridDim = dim3(units, slots, rows);
  config.dynamicSmemBytes = static_cast<size_t>(staged_shared_bytes<Reader, Shape>(experts.intermediate));
  return cudaLaunchKernelEx(&config, down, static_cast<const float*>(scratch.activated), ids, weights, top_k, experts,
                            scratch.partial, scratch.counters, out);
}

// The two launches for `tokens` tokens (at most kTokenMoeMaxTokens; one wave per pass and token), both programmatic
// dependents of what precedes them, in the shape BEAMLINE_CUDA_TOKEN_MOE names where it fits the widths, else the
// default one; staged_token_moe_fits checked by the caller, h and scratch.activated 16-byte aligned, scratch sized for
// `tokens` (token_moe.h).
template <class Reader, class Experts>
cudaError_t launch_staged_token_moe(const float* h, const int32_t* ids, const float* weights, int32_t tokens,
                                    int32_t top_k, const Experts& experts, const TokenMoeScratch& scratch, float* out,
                                    cudaStream_t stream) {
  if constexpr (!DecodesByCvt<typename Reader::Operand>::value) {  // staged-cvt, staged-half-cvt: the default shape
    const TokenMoeVersion version = token_moe_version();
    if (version == TokenMoeVersion::StagedWide &&
        staged_shape_fits<Reader, WideStagedShape>(experts.hidden, experts.intermediate, top_k))
      return launch_staged_shape<Reader, WideStagedShape>(h, ids, weights, tokens, top_k, experts, scratch, out,
                                                          stream);
    if (version == TokenMoeVersion::StagedWide5 &&
        staged_shape_fits<Reader, DeepWideStagedShape>(experts.hidden, experts.intermediate, top_k))
      return launch_staged_shape<Reader, DeepWideStagedShape>(h, ids, weights, tokens, top_k, experts, scratch, out,
                                                              stream);
  }
  return launch_staged_shape<Reader, DefaultStagedShape>(h, ids, weights, tokens, top_k, experts, scratch, out,
                                                         stream);
}

}  // namespace beamline::cuda
