// One token's routed FP8 block-128 experts (decode at batch 1; fp8.h moe_one_token) on the tensor cores: the tile dot
// product of quant/token_moe.cuh's kernels (every routed expert's gate|up in one launch, every down in a second).
//
// Why tensor cores for a matrix-vector product: dotting dequantized weights with F32 activations on the CUDA cores
// costs one to two conversions per weight (E4M3 -> F16 -> F32), and conversions issue at an eighth of the FMA rate
// (16 against 128 per clock and multiprocessor on compute capability 9.0): the CUDA-core kernels' ~2 TB/s fits that. Here each E4M3 code becomes F16 by bit operations (exact: E4M3 is a subset of
// F16) and mma.sync m16n8k16 multiplies sixteen weight rows by the activation vector split into two F16 columns
// (quant/activation_split.cuh: 22 bits of every element); products are exact and sums FP32, so the result equals
// the W8A16 reference up to summation order like the CUDA-core kernels did. The weight block scale (over the split's
// power of two) is applied to each 128-wide k block's sum.
//
// Operand layout: lane (g, c) = (lane / 4, lane % 4) of a warp owning rows r0 + g and r0 + g + 8 loads, per 64-wide k
// step, the 16 codes [64 step + 16 c, + 16) of both rows (four lanes read one row's 64 contiguous bytes). Its word q
// (codes 4q..4q+3 of its chunk) feeds mma q: codes 0 and 2 as the A registers of k columns 2c, 2c + 1 and codes 1 and 3
// as those of 2c + 8, 2c + 9. Any assignment of physical to logical k works when B follows it, so the activation split
// is stored in that order, and lanes g = 0 (hi) and g = 1 (lo) load their B registers with two 16-byte shared loads
// per step; the other lanes' B columns are zero.
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/mma_f16.cuh"
#include "backend/cuda/quant/fp8.h"
#include "backend/cuda/quant/staged_moe.cuh"
#include "backend/cuda/quant/token_moe.cuh"

namespace beamline::cuda::fp8 {
namespace {

constexpr int kStep = 64;   // k per step: four lanes x 16 codes
constexpr int kBatch = 4;   // steps (two 128-wide blocks) of weights loaded before the first is used
static_assert(kBatch * kStep == 2 * kBlock, "a batch holds two k blocks: stream_ring's halves");

// d += one tile's 16 codes of rows g (`low`) and g + 8 (`high`), word q feeding mma q, times the split's B registers.
// Word q is k group 4 (16-byte chunk) + q, so its parity is q's (kWords: the words decoded by cvt).
template <CvtWords kWords = CvtWords::None>
__device__ __forceinline__ void fp8_chunk_mma(const uint32_t (&low)[4], const uint32_t (&high)[4],
                                              const uint32_t (&b_regs)[8], float (&d)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t a[4];  // row g k (2c, 2c+1), row g+8 (2c, 2c+1), row g (2c+8, 2c+9), row g+8 (2c+8, 2c+9)
    e4m3_word<kWords>(low[q], q, a[0], a[2]);
    e4m3_word<kWords>(high[q], q, a[1], a[3]);
    mma_f16(d, a, b_regs[2 * q], b_regs[2 * q + 1]);
  }
}

// Two tiles of 16 rows (rows[i][0] row g, rows[i][1] row g + 8) and their block-scale rows, dotted with the split.
// kRing (the default; BEAMLINE_CUDA_TOKEN_MOE=legacy: false): the batch's registers are a ring of two 128-wide
// blocks, each reloaded with the next batch's block as soon as its MMAs have read it, so that a warp always has
// loads in flight. Without it (the first version) a warp loaded a batch, waited a whole HBM round trip for it,
// computed, and only then loaded the next, so its loads were in flight only part of the time.
template <bool kRing>
struct Fp8Dot {
  using Batch = uint4[kBatch][2][2];
  const uint8_t* rows[2][2];
  const float* scales[2];
  int64_t k;

  static __device__ Fp8Dot<kRing> make(const Experts& experts, int32_t e, const int (&matrix)[2],
                                const int64_t (&first_row)[2], int64_t row_count, int64_t k, int g) {
    Fp8Dot<kRing> dot;
    dot.k = k;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const auto* weight = static_cast<const uint8_t*>(experts.weight[matrix[i]][e]);
      dot.rows[i][0] = weight + min(first_row[i] + g, row_count - 1) * k;
      dot.rows[i][1] = weight + min(first_row[i] + g + 8, row_count - 1) * k;
      dot.scales[i] = experts.scale[matrix[i]][e] + (first_row[i] / kBlock) * blocks_of(k);  // 16 rows, one block
    }
    return dot;
  }

  // Steps first_step + u for u in [kFrom, kTo) into bits[u].
  template <int kFrom = 0, int kTo = kBatch>
  __device__ __forceinline__ void load(int first_step, int c, Batch& bits) const {
#pragma unroll
    for (int u = kFrom; u < kTo; ++u) {
      const int64_t column = int64_t{first_step + u} * kStep + 16 * c;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) bits[u][i][r] = column < k ? load_streaming(rows[i][r] + column) : uint4{};
    }
  }

  __device__ __forceinline__ void run(const Split& split, int lane, Batch& bits, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4;
    const int steps = static_cast<int>((k + kStep - 1) / kStep), blocks = static_cast<int>(blocks_of(k));
    const uint32_t* b_source = g == 0 ? split.hi : split.lo;
    float d[2][4] = {};           // the current 128-wide block's sums (a half of the batch)
    float block_scale[2] = {};    // its weight scales, loaded at its first step, used after its MMAs
    auto step_of = [&](int u, int step) {
      if (step % 2 == 0)
#pragma unroll
        for (int i = 0; i < 2; ++i) block_scale[i] = __ldg(scales[i] + step / 2);
      uint4 b_words[2] = {};
      if (g < 2) {
        const uint4* source = reinterpret_cast<const uint4*>(b_source + (int64_t{step} * kStep + 16 * c) / 2);
        b_words[0] = source[0];
        b_words[1] = source[1];
      }
      const uint32_t b_regs[8] = {b_words[0].x, b_words[0].y, b_words[0].z, b_words[0].w,
                                  b_words[1].x, b_words[1].y, b_words[1].z, b_words[1].w};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t low[4] = {bits[u][i][0].x, bits[u][i][0].y, bits[u][i][0].z, bits[u][i][0].w};
        const uint32_t high[4] = {bits[u][i][1].x, bits[u][i][1].y, bits[u][i][1].z, bits[u][i][1].w};
        fp8_chunk_mma(low, high, b_regs, d[i]);
      }
    };
    // A half is one 128-wide block: its sums promoted by the weight block's scale over the split's power of two.
    // Column 0 is hi, column 1 lo (lanes c = 0); the other lanes' columns are zero.
    auto block_done = [&](int first, int half) {
      const int block = first / 2 + half;
      if (block >= blocks) return;  // past k: no step ran, d is zero
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float promote = block_scale[i] * split.unscale[block];
        total[i][0] += (d[i][0] + d[i][1]) * promote;
        total[i][1] += (d[i][2] + d[i][3]) * promote;
#pragma unroll
        for (int j = 0; j < 4; ++j) d[i][j] = 0.0f;
      }
    };
    stream_ring<kRing, kBatch>(*this, steps, c, bits, step_of, block_done);
  }
};

// The same products with the weights staged through shared memory (quant/staged_moe.cuh): a stage is one 128-wide k
// block, two of Fp8Dot's 64-wide steps, lane (g, c) reading chunk 4u + c of its rows for step u (Fp8Dot's codes), and
// the stage holding the two tiles' block scales. kWords: the words decoded by cvt (mma_f16.cuh).
template <CvtWords kWords>
struct Fp8Stage {
  using Operand = SplitOperand<kWords>;
  static constexpr int kStageK = static_cast<int>(kBlock);
  static constexpr int kScaleBytes = 16;  // two F32 block scales, padded
  const uint8_t* codes[2];
  const float* scales[2];  // the tiles' block-scale rows
  int64_t first_row[2];
  int64_t row_count, k;

  static __device__ Fp8Stage make(const Experts& experts, int32_t e, const int (&matrix)[2],
                                  const int64_t (&first)[2], int64_t rows, int64_t k) {
    Fp8Stage stage;
    stage.row_count = rows;
    stage.k = k;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      stage.codes[i] = static_cast<const uint8_t*>(experts.weight[matrix[i]][e]);
      stage.first_row[i] = first[i];
      stage.scales[i] = experts.scale[matrix[i]][e] + (min(first[i], rows - 1) / kBlock) * blocks_of(k);
    }
    return stage;
  }
  __device__ int64_t row_bytes() const { return k; }
  __device__ const uint8_t* row_codes(int i, int t) const { return codes[i] + min(first_row[i] + t, row_count - 1) * k; }
  __device__ void copy_scales(int stage, unsigned char* target, int lane) const {
    if (lane < 2) copy_async4(target + 4 * lane, (lane == 0 ? scales[0] : scales[1]) + stage, true);
  }

  __device__ __forceinline__ void consume(const unsigned char* stage_codes, const unsigned char* stage_scales, int s,
                                          const Split& split, int lane, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4, swizzle = stage_swizzle(g);
    const uint32_t* b_source = g == 0 ? split.hi : split.lo;
    float d[2][4] = {};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint4 b_words[2] = {};
      if (g < 2) {
        const uint4* source = reinterpret_cast<const uint4*>(b_source + (int64_t{s} * kStageK + kStep * u + 16 * c) / 2);
        b_words[0] = source[0];
        b_words[1] = source[1];
      }
      const uint32_t b_regs[8] = {b_words[0].x, b_words[0].y, b_words[0].z, b_words[0].w,
                                  b_words[1].x, b_words[1].y, b_words[1].z, b_words[1].w};
      const int chunk = 16 * ((4 * u + c) ^ swizzle);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 row_g = *reinterpret_cast<const uint4*>(stage_codes + (kTokenTileRows * i + g) * kStageRowBytes + chunk);
        const uint4 row_g8 =
            *reinterpret_cast<const uint4*>(stage_codes + (kTokenTileRows * i + 8 + g) * kStageRowBytes + chunk);
        const uint32_t low[4] = {row_g.x, row_g.y, row_g.z, row_g.w};
        const uint32_t high[4] = {row_g8.x, row_g8.y, row_g8.z, row_g8.w};
        fp8_chunk_mma<kWords>(low, high, b_regs, d[i]);
      }
    }
    // The block's sums promoted by the weight block's scale over the split's power of two; column 0 is hi, column 1
    // lo (lanes c = 0).
    const float* block_scale = reinterpret_cast<const float*>(stage_scales);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float promote = block_scale[i] * split.unscale[s];
      total[i][0] += (d[i][0] + d[i][1]) * promote;
      total[i][1] += (d[i][2] + d[i][3]) * promote;
    }
  }
  __device__ void finish(float (&)[2][2]) const {}
};

}  // namespace

bool moe_one_token_supported(int64_t hidden, int64_t intermediate, int32_t top_k) {
  return top_k <= kMaxStreamTopK && hidden % 16 == 0 && intermediate % 16 == 0 &&
         token_moe_fits(hidden, intermediate, top_k);
}

cudaError_t moe_one_token(const float* h, const int32_t* ids, const float* weights, int32_t top_k,
                          const Experts& experts, const TokenMoeScratch& scratch, float* out, cudaStream_t stream) {
  if (!moe_supported(experts.experts, experts.hidden, experts.intermediate) ||
      !moe_one_token_supported(experts.hidden, experts.intermediate, top_k) ||
      reinterpret_cast<uintptr_t>(h) % 16 != 0 || reinterpret_cast<uintptr_t>(scratch.activated) % 16 != 0)
    return cudaErrorInvalidValue;
  const TokenMoeVersion version = token_moe_version();
  if (version == TokenMoeVersion::Legacy)
    return launch_token_moe<Fp8Dot<false>, false>(h, ids, weights, top_k, experts, scratch.activated, out, stream);
  if (token_moe_staged(version) &&
      staged_token_moe_fits<Fp8Stage<CvtWords::None>>(experts.hidden, experts.intermediate, top_k)) {
    if (version == TokenMoeVersion::StagedCvt)
      return launch_staged_token_moe<Fp8Stage<CvtWords::All>>(h, ids, weights, 1, top_k, experts, scratch, out, stream);
    if (version == TokenMoeVersion::StagedHalfCvt)
      return launch_staged_token_moe<Fp8Stage<CvtWords::Even>>(h, ids, weights, 1, top_k, experts, scratch, out,
                                                                stream);
    return launch_staged_token_moe<Fp8Stage<CvtWords::None>>(h, ids, weights, 1, top_k, experts, scratch, out,
                                                             stream);
  }
  return launch_token_moe<Fp8Dot<true>, true>(h, ids, weights, top_k, experts, scratch.activated, out, stream);
}

}  // namespace beamline::cuda::fp8
