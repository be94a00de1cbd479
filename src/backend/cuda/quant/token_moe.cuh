#pragma once
// One token's routed experts on the tensor cores (decode at batch 1), for FP8, MXFP8 and NVFP4 weights: every routed
// expert's gate|up in one launch (SwiGLU fused) and every routed expert's down in a second (the combine fused, in j
// order), each a single wave over the GPU. The format enters as `Dot` (quant/fp8_token_moe.cu for FP8 block-128,
// quant/micro_rows.cu for MXFP8 and NVFP4): the dot products of a warp's two 16-row tiles with the token's
// activation split (activation_split.cuh), with this interface:
//   using Batch = ...;                      a batch of weight loads (registers)
//   static Dot make(experts, e, matrix[2], first_row[2], rows, k, g)
//                                           tiles i = 0, 1: rows first_row[i] + g and + 8 of matrix[i] (0 gate, 1 up,
//                                           2 down) of expert e, rows of width k, rows past `rows` clamped
//   void load<from, to>(first_step, c, batch)
//                                           steps [from, to) of a batch (default: all of it); the first batch is
//                                           loaded before the split is written (the stream starts first)
//   void run(split, lane, batch, total)     total[i][0] (row g) and [i][1] (row g + 8) in lanes c = 0 (stream_ring)
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/kernel_variant.h"
#include "backend/cuda/quant/activation_split.cuh"

namespace beamline::cuda {

constexpr int kTokenTileRows = 16;                     // weight rows of one mma (M)
constexpr int kTokenDownRows = 2 * kTokenTileRows;     // output rows per block: two tiles per routed expert
constexpr int kTokenMaxTopK = 8;                       // warps of a down block: one per routed expert
constexpr int kTokenMaxSharedBytes = 227 * 1024;       // Hopper's opt-in limit of shared memory per block
constexpr int kTokenDownStaticBytes = static_cast<int>(sizeof(float)) * kTokenMaxTopK * kTokenDownRows;

// The weight stream of a Dot whose registers hold kBatch steps as two halves: calls step(u, s) for s = first + u, the
// steps of each batch in order, and half_done(first, half) after each half. kRing: then loads the next batch's half
// into the registers just read (dot.load<from, to>(first + kBatch, ...)), so that a warp always has loads in flight;
// else (the first versions) the next batch is loaded whole before it is used.
template <bool kRing, int kBatch, class Dot, class Batch, class Step, class HalfDone>
__device__ __forceinline__ void stream_ring(const Dot& dot, int steps, int c, Batch& batch, const Step& step,
                                            const HalfDone& half_done) {
  static_assert(kBatch % 2 == 0, "two halves");
  constexpr int kHalf = kBatch / 2;
  for (int first = 0; first < steps; first += kBatch) {
    if (!kRing && first > 0) dot.load(first, c, batch);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int v = 0; v < kHalf; ++v) {
        const int u = half * kHalf + v;
        if (first + u >= steps) break;
        step(u, first + u);
      }
      half_done(first, half);
      if constexpr (kRing) {  // half is a constant once unrolled; past k, loads give zeros and read nothing
        if (half == 0)
          dot.template load<0, kHalf>(first + kBatch, c, batch);
        else
          dot.template load<kHalf, kBatch>(first + kBatch, c, batch);
      }
    }
  }
}

// The versions (BEAMLINE_CUDA_TOKEN_MOE=NAME; common/kernel_variant.h lists the names in this enum's order):
//  - staged (default): the weights through shared memory (quant/staged_moe.cuh), for the formats and widths it takes;
//    the others run `ring`. staged-wide and staged-wide5: the same kernels in other shapes (staged_moe.cuh);
//    staged-cvt and staged-half-cvt: FP8 and MXFP8 codes decoded by cvt, every word or every other (mma_f16.cuh).
//  - ring: gate|up blocks of 4 warps (320 blocks, at most 3 where the average is 2.4), and the down pass a
//    programmatic dependent of the gate|up pass: its blocks start while gate|up still runs, load their first batch
//    of weights (which do not depend on it) and only then wait for the activations (griddepcontrol.wait).
//  - legacy: gate|up blocks of 8 warps (128 intermediate rows), 160 blocks at Beam-1.0's I = 2,560 and top 8 for
//    132 multiprocessors, so 28 of them streamed twice the bytes of the others; the down pass launched after.
enum class TokenMoeVersion { Staged, Ring, Legacy, StagedWide, StagedWide5, StagedCvt, StagedHalfCvt };
static_assert(static_cast<std::size_t>(TokenMoeVersion::StagedHalfCvt) + 1 == std::size(kTokenMoeNames),
              "one version per name");
inline TokenMoeVersion token_moe_version() {
  static const TokenMoeVersion version = [] {
    const int index = kernel_variant_index(kTokenMoeFamily);
    return static_cast<TokenMoeVersion>(index < 0 ? 0 : index);
  }();
  return version;
}
// Whether the version takes the staged kernels (in one of their shapes) where they fit.
inline bool token_moe_staged(TokenMoeVersion version) {
  return version == TokenMoeVersion::Staged || version == TokenMoeVersion::StagedWide ||
         version == TokenMoeVersion::StagedWide5 || version == TokenMoeVersion::StagedCvt ||
         version == TokenMoeVersion::StagedHalfCvt;
}
inline bool token_moe_legacy() { return token_moe_version() == TokenMoeVersion::Legacy; }
// BF16 experts take the staged kernels only when BEAMLINE_CUDA_TOKEN_MOE=staged names them: on the H200 one token's
// BF16 MoE layer took 0.200 ms staged against 0.172 ms streamed (bench/results/2026-12-03-session9-final.md).
inline bool token_moe_bf16_staged() {
  static const bool staged = kernel_variant("BEAMLINE_CUDA_TOKEN_MOE") == "staged";
  return staged;
}
template <bool kOverlapped>
constexpr int kTokenGateUpWarps = kOverlapped ? 4 : 8;

// activated[j, i] = silu(gate_e[i] · h) * (up_e[i] · h) for e = ids[j], j = blockIdx.y: each warp owns 16 intermediate
// rows of gate and of up. An unknown expert reads expert 0 (every load in bounds) and writes zeros; the down pass
// makes the token NaN.
template <class Dot, class Experts, bool kOverlapped>
__global__ void __launch_bounds__(kTokenGateUpWarps<kOverlapped> * 32, 16 / kTokenGateUpWarps<kOverlapped>)
    token_gate_up_kernel(const float* __restrict__ h, const int32_t* __restrict__ ids, Experts experts,
                         float* __restrict__ activated) {
  extern __shared__ __align__(16) unsigned char token_shared[];
  constexpr int kWarps = kTokenGateUpWarps<kOverlapped>;
  // The down pass may start: it reads ids (written before this grid started) and weights before it waits.
  if constexpr (kOverlapped) asm volatile("griddepcontrol.launch_dependents;\n" ::);
  const int64_t hidden = experts.hidden, inter = experts.intermediate;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32), g = lane / 4;
  const int j = static_cast<int>(blockIdx.y);
  const int32_t id = ids[j];
  const bool known = id >= 0 && id < experts.experts;
  const int64_t tile = (int64_t{blockIdx.x} * kWarps + warp) * kTokenTileRows;
  const Dot dot = Dot::make(experts, known ? id : 0, {0, 1}, {tile, tile}, inter, hidden, g);
  typename Dot::Batch batch;
  if (tile < inter) dot.load(0, lane % 4, batch);
  const Split split = split_at(token_shared, hidden);
  split_activations(h, hidden, split, warp, kWarps, lane);
  __syncthreads();
  if (tile >= inter) return;
  float total[2][2] = {};
  dot.run(split, lane, batch, total);
  if (lane % 4 != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = tile + g + 8 * r;
    if (row < inter) activated[j * inter + row] = known ? silu(total[0][r]) * total[1][r] : 0.0f;
  }
}

// out[n] = sum over j in order of weights[j] * (down_{ids[j]}[n] · activated[j]): block = 32 output rows, warp j =
// routed expert j (each splits its own activated row), the combine in j order through shared memory.
template <class Dot, class Experts, bool kOverlapped>
__global__ void __launch_bounds__(kTokenMaxTopK * 32, 2)
    token_down_kernel(const float* __restrict__ activated, const int32_t* __restrict__ ids,
                      const float* __restrict__ weights, int32_t top_k, Experts experts, float* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char token_shared[];
  __shared__ float partial[kTokenMaxTopK][kTokenDownRows];
  const int64_t hidden = experts.hidden, inter = experts.intermediate;
  const int j = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32), g = lane / 4;
  const int32_t id = ids[j];
  const int64_t first_row = int64_t{blockIdx.x} * kTokenDownRows;
  const Dot dot = Dot::make(experts, id >= 0 && id < experts.experts ? id : 0, {2, 2},
                            {first_row, first_row + kTokenTileRows}, hidden, inter, g);
  typename Dot::Batch batch;
  dot.load(0, lane % 4, batch);
  if constexpr (kOverlapped) asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the gate|up pass is done
  const Split split = split_at(token_shared + j * split_bytes(inter), inter);
  split_activations(activated + j * inter, inter, split, 0, 1, lane);
  __syncwarp();
  float total[2][2] = {};
  dot.run(split, lane, batch, total);
  if (lane % 4 == 0)
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) partial[j][kTokenTileRows * t + g + 8 * r] = total[t][r];
  __syncthreads();
  if (threadIdx.x >= kTokenDownRows || first_row + threadIdx.x >= hidden) return;
  float sum = 0.0f;
  bool valid = true;
  for (int32_t slot = 0; slot < top_k; ++slot) {
    valid = valid && ids[slot] >= 0 && ids[slot] < experts.experts;
    sum += weights[slot] * partial[slot][threadIdx.x];
  }
  out[first_row + threadIdx.x] = valid ? sum : __int_as_float(0x7fc00000);
}

// Whether the splits fit in shared memory (H up to ~58K; I up to ~7K at top_k 8).
inline bool token_moe_fits(int64_t hidden, int64_t intermediate, int32_t top_k) {
  return top_k >= 1 && top_k <= kTokenMaxTopK && split_bytes(hidden) <= kTokenMaxSharedBytes &&
         top_k * split_bytes(intermediate) + kTokenDownStaticBytes <= kTokenMaxSharedBytes;
}

// The two launches; h and activated ([top_k, I] scratch) 16-byte aligned, token_moe_fits checked by the caller.
template <class Dot, bool kOverlapped, class Experts>
cudaError_t launch_token_moe(const float* h, const int32_t* ids, const float* weights, int32_t top_k,
                             const Experts& experts, float* activated, float* out, cudaStream_t stream) {
  constexpr auto gate_up = token_gate_up_kernel<Dot, Experts, kOverlapped>;
  constexpr auto down = token_down_kernel<Dot, Experts, kOverlapped>;
  // Above 48 KB a kernel's dynamic shared memory needs the opt-in: granted once, up to the limit.
  static const cudaError_t allowed = [] {
    const cudaError_t status =
        cudaFuncSetAttribute(gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize, kTokenMaxSharedBytes);
    return status != cudaSuccess ? status
                                 : cudaFuncSetAttribute(down, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        kTokenMaxSharedBytes - kTokenDownStaticBytes);
  }();
  if (allowed != cudaSuccess) return allowed;
  const auto up_bytes = static_cast<int>(split_bytes(experts.hidden));
  const auto down_bytes = static_cast<int>(top_k * split_bytes(experts.intermediate));
  constexpr int kWarps = kTokenGateUpWarps<kOverlapped>;
  const dim3 up_grid(blocks_for(experts.intermediate, kWarps * kTokenTileRows), static_cast<unsigned int>(top_k));
  gate_up<<<up_grid, kWarps * 32, up_bytes, stream>>>(h, ids, experts, activated);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks_for(experts.hidden, kTokenDownRows));
  config.blockDim = dim3(static_cast<unsigned int>(top_k * 32));
  config.dynamicSmemBytes = static_cast<size_t>(down_bytes);
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = kOverlapped ? 1 : 0;
  return cudaLaunchKernelEx(&config, down, activated, ids, weights, top_k, experts, out);
}

}  // namespace beamline::cuda
