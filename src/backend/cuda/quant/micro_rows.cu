// MXFP8 and NVFP4 kernels (micro.h): one-row weight streaming (projections, the LM head, the experts token by token)
// with the codes decoded in registers, the BF16 decode for the GEMM path, and the output scaling of that path.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/quant/e4m3_unpack.cuh"
#include "backend/cuda/quant/micro.h"
#include "backend/cuda/quant/staged_moe.cuh"
#include "backend/cuda/quant/token_moe.cuh"

namespace beamline::cuda::micro {
namespace {

// ---- decoding ----
// Eight E2M1 codes (one 32-bit word, element n in bits 4n..4n+3) as F32 times 2^-14, exactly: the three magnitude
// bits of a code placed at F16's bits 9-11 and its sign at bit 15 make the F16 of the value times 2^-14 (the exponent
// field 0 giving E2M1's one subnormal, 0.5), so a pair costs a few bit operations and one conversion. The 2^14 is
// folded into the group's scale (kE2m1Unscale).
constexpr float kE2m1Unscale = 16384.0f;
__device__ __forceinline__ void unpack_e2m1(uint32_t word, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = word >> (4 * i);  // element i in bits 0-3, element i + 4 in bits 16-19
    const uint32_t bits = ((v & 0x00070007u) << 9) | ((v & 0x00080008u) << 12);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
    out[i] = f.x;
    out[i + 4] = f.y;
  }
}

__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code & 0xffu), __NV_E4M3);
  return __half2float(__half(raw));
}

// 2^(e - 127); 0xff is NaN (tensor/dtype.h's e8m0_to_f32). e = 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_float(uint32_t e) {
  e &= 0xffu;
  if (e == 0xffu) return __int_as_float(0x7fc00000);
  return e == 0 ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(e << 23));
}

template <int kCount>
__device__ __forceinline__ float dot(const float* w, const float* x) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kCount; ++i) sum += w[i] * x[i];
  return sum;
}

// ---- the chunk one lane reads from one weight row per step ----
// MXFP8: one scale group, 32 codes in two 16-byte loads.
struct Mxfp8Chunk {
  static constexpr int kElements = 32, kGroup = 32;
  struct Bits {
    uint4 a, b;
    uint32_t scale;
  };
  static __host__ __device__ int64_t row_bytes(int64_t in) { return in; }
  static __device__ Bits load(const uint8_t* codes, const uint8_t* scales, int64_t chunk) {
    const uint8_t* p = codes + chunk * kElements;
    return {load_streaming(p), load_streaming(p + 16), __ldg(scales + chunk)};
  }
  static __device__ float dot_chunk(const Bits& bits, const float (&x)[kElements]) {
    float w[16];
    unpack_e4m3(bits.a, w);
    float sum = dot<16>(w, x);
    unpack_e4m3(bits.b, w);
    sum += dot<16>(w, x + 16);
    return sum * e8m0_to_float(bits.scale);
  }
};

// NVFP4 rows whose width is a multiple of 32: two scale groups, 32 codes in one 16-byte load.
struct Nvfp4Chunk32 {
  static constexpr int kElements = 32, kGroup = 16;
  struct Bits {
    uint4 codes;
    uint32_t scales;  // two E4M3 bytes
  };
  static __host__ __device__ int64_t row_bytes(int64_t in) { return in / 2; }
  static __device__ Bits load(const uint8_t* codes, const uint8_t* scales, int64_t chunk) {
    return {load_streaming(codes + chunk * 16),
            __ldg(reinterpret_cast<const unsigned short*>(scales) + chunk)};
  }
  static __device__ float dot_chunk(const Bits& bits, const float (&x)[kElements]) {
    const uint32_t words[4] = {bits.codes.x, bits.codes.y, bits.codes.z, bits.codes.w};
    float group[2] = {};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float v[8];
      unpack_e2m1(words[w], v);
      group[w / 2] += dot<8>(v, x + 8 * w);
    }
    return group[0] * (e4m3_to_float(bits.scales) * kE2m1Unscale) +
           group[1] * (e4m3_to_float(bits.scales >> 8) * kE2m1Unscale);
  }
};

// NVFP4 rows of any width (a multiple of 16): one scale group, 16 codes in one 8-byte load.
struct Nvfp4Chunk16 {
  static constexpr int kElements = 16, kGroup = 16;
  struct Bits {
    uint2 codes;
    uint32_t scale;
  };
  static __host__ __device__ int64_t row_bytes(int64_t in) { return in / 2; }
  static __device__ Bits load(const uint8_t* codes, const uint8_t* scales, int64_t chunk) {
    return {__ldcs(reinterpret_cast<const uint2*>(codes) + chunk), __ldg(scales + chunk)};
  }
  static __device__ float dot_chunk(const Bits& bits, const float (&x)[kElements]) {
    float v[8];
    unpack_e2m1(bits.codes.x, v);
    float sum = dot<8>(v, x);
    unpack_e2m1(bits.codes.y, v);
    sum += dot<8>(v, x + 8);
    return sum * (e4m3_to_float(bits.scale) * kE2m1Unscale);
  }
};

// sum[j] += this lane's share of row j · x for kRows weight rows of `chunks` chunks each: lane l takes chunks
// l, l + 32, ...; kUnroll chunks of every row are loaded before the first is used, and each chunk of x is loaded
// once into registers for all kRows rows.
template <class Chunk, int kRows, int kUnroll>
__device__ __forceinline__ void rows_dot(const uint8_t* const (&codes)[kRows], const uint8_t* const (&scales)[kRows],
                                         int64_t chunks, const float* __restrict__ x, int lane, float (&sum)[kRows]) {
  for (int64_t base = lane; base < chunks; base += 32 * kUnroll) {
    typename Chunk::Bits bits[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + 32 * u;
#pragma unroll
      for (int j = 0; j < kRows; ++j)
        if (c < chunks) bits[u][j] = Chunk::load(codes[j], scales[j], c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + 32 * u;
      if (c >= chunks) break;
      float xv[Chunk::kElements];
#pragma unroll
      for (int i = 0; i < Chunk::kElements; i += 4) {
        const float4 a = *reinterpret_cast<const float4*>(x + c * Chunk::kElements + i);
        xv[i] = a.x;
        xv[i + 1] = a.y;
        xv[i + 2] = a.z;
        xv[i + 3] = a.w;
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) sum[j] += Chunk::dot_chunk(bits[u][j], xv);
    }
  }
}

__device__ __forceinline__ float scale_2_of(const float* scale_2) { return scale_2 != nullptr ? *scale_2 : 1.0f; }

// ---- projections of one row ----
constexpr int kStreamWarps = 8;
constexpr int kStreamRows = 4;  // weight rows per warp: each activation load serves four rows

struct Stacked {
  Weight weight[kMaxStreamWeights];
  float* y[kMaxStreamWeights];
  int64_t first_row[kMaxStreamWeights + 1];
  int32_t count;
  int64_t in, total_rows;
  float softcap;
};

template <class Chunk>
__global__ void __launch_bounds__(kStreamWarps * 32) stream_kernel(const float* __restrict__ x, Stacked stacked) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first = (int64_t{blockIdx.x} * kStreamWarps + warp) * kStreamRows;
  if (first >= stacked.total_rows) return;
  const int64_t in = stacked.in, scale_width = in / Chunk::kGroup;
  const uint8_t* codes[kStreamRows];
  const uint8_t* scales[kStreamRows];
  const float* scale_2[kStreamRows];
  float* y[kStreamRows];
#pragma unroll
  for (int j = 0; j < kStreamRows; ++j) {
    // Rows past the last are clamped onto it (read again, never stored); the weight is picked by unrolled
    // comparisons so that the parameter is not copied to local memory.
    const int64_t row = min(first + j, stacked.total_rows - 1);
    Weight weight = stacked.weight[0];
    float* out = stacked.y[0];
    int64_t start = 0;
#pragma unroll
    for (int s = 1; s < kMaxStreamWeights; ++s) {
      if (s < stacked.count && row >= stacked.first_row[s]) {
        weight = stacked.weight[s];
        out = stacked.y[s];
        start = stacked.first_row[s];
      }
    }
    codes[j] = weight.codes + (row - start) * Chunk::row_bytes(in);
    scales[j] = weight.scales + (row - start) * scale_width;
    scale_2[j] = weight.scale_2;
    y[j] = out + (row - start);
  }
  float sum[kStreamRows] = {};
  rows_dot<Chunk, kStreamRows, 2>(codes, scales, in / Chunk::kElements, x, lane, sum);
#pragma unroll
  for (int j = 0; j < kStreamRows; ++j) {
    float value = warp_sum(sum[j]);
    if (lane != 0 || first + j >= stacked.total_rows) continue;
    value *= scale_2_of(scale_2[j]);
    if (stacked.softcap > 0.0f) value = stacked.softcap * tanhf(value / stacked.softcap);
    *y[j] = value;
  }
}

// ---- the experts, token by token ----

constexpr int kGateUpWarps = 8;
constexpr int kGateUpRows = 2;  // intermediate rows per warp, of gate and of up: four weight rows

// activated[s, i] = silu(gate_e[i] · h_t) * (up_e[i] · h_t) for the slot s = blockIdx.x, t = s / top_k, e = ids[s].
template <class Chunk>
__global__ void __launch_bounds__(kGateUpWarps * 32)
    gate_up_kernel(const float* __restrict__ h, const int32_t* __restrict__ ids, int32_t top_k, Experts experts,
                   float* __restrict__ activated) {
  const int64_t inter = experts.intermediate, hidden = experts.hidden;
  const int64_t row = (int64_t{blockIdx.y} * kGateUpWarps + threadIdx.x / 32) * kGateUpRows;
  if (row >= inter) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t slot = blockIdx.x, token = slot / top_k;
  const int32_t e = ids[slot];
  if (e < 0 || e >= experts.experts) {  // the down pass makes the token NaN
    if (lane < kGateUpRows && row + lane < inter) activated[slot * inter + row + lane] = 0.0f;
    return;
  }
  const int64_t scale_width = hidden / Chunk::kGroup;
  const uint8_t* codes[2 * kGateUpRows];
  const uint8_t* scales[2 * kGateUpRows];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int r = 0; r < kGateUpRows; ++r) {
      const int64_t i = min(row + r, inter - 1);
      codes[m * kGateUpRows + r] = experts.codes[m][e] + i * Chunk::row_bytes(hidden);
      scales[m * kGateUpRows + r] = experts.scales[m][e] + i * scale_width;
    }
  float sum[2 * kGateUpRows] = {};
  rows_dot<Chunk, 2 * kGateUpRows, 2>(codes, scales, hidden / Chunk::kElements, h + token * hidden, lane, sum);
  float result[2 * kGateUpRows];
#pragma unroll
  for (int j = 0; j < 2 * kGateUpRows; ++j) result[j] = warp_sum(sum[j]);
  if (lane != 0) return;
  const float gate_scale = experts.scale_2[0] != nullptr ? *experts.scale_2[0][e] : 1.0f;
  const float up_scale = experts.scale_2[1] != nullptr ? *experts.scale_2[1][e] : 1.0f;
#pragma unroll
  for (int r = 0; r < kGateUpRows; ++r)
    if (row + r < inter)
      activated[slot * inter + row + r] = silu(result[r] * gate_scale) * (result[kGateUpRows + r] * up_scale);
}

constexpr int kDownRows = 2;  // output rows per block

// out[t, n] = sum over j in order of weights[t, j] * (down_{ids[t, j]}[n] · activated[t, j]) for t = blockIdx.x: warp
// j streams routed expert j's rows, so that every expert's loads are in flight at once (a warp walking the experts one
// after another waited on one HBM round trip per expert), and the block combines the experts in j order.
template <class Chunk>
__global__ void __launch_bounds__(kMaxTopK * 32, 2)
    down_kernel(const float* __restrict__ activated, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                int32_t top_k, Experts experts, float* __restrict__ out) {
  __shared__ float partial[kMaxTopK][kDownRows];
  const int64_t inter = experts.intermediate, hidden = experts.hidden;
  const int64_t row = int64_t{blockIdx.y} * kDownRows;
  const int j = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t token = blockIdx.x, slot = token * top_k + j, scale_width = inter / Chunk::kGroup;
  const int32_t id = ids[slot];
  const int32_t e = id >= 0 && id < experts.experts ? id : 0;  // an unknown expert reads expert 0: loads in bounds
  const uint8_t* codes[kDownRows];
  const uint8_t* scales[kDownRows];
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) {
    const int64_t n = min(row + r, hidden - 1);
    codes[r] = experts.codes[2][e] + n * Chunk::row_bytes(inter);
    scales[r] = experts.scales[2][e] + n * scale_width;
  }
  float sum[kDownRows] = {};
  rows_dot<Chunk, kDownRows, 4>(codes, scales, inter / Chunk::kElements, activated + slot * inter, lane, sum);
  const float down_scale = experts.scale_2[2] != nullptr ? *experts.scale_2[2][e] : 1.0f;
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) {
    const float dot = warp_sum(sum[r]) * down_scale;
    if (lane == 0) partial[j][r] = dot;
  }
  __syncthreads();
  if (threadIdx.x >= kDownRows || row + threadIdx.x >= hidden) return;
  float total = 0.0f;
  bool valid = true;
  for (int32_t k = 0; k < top_k; ++k) {
    const int32_t routed = ids[token * top_k + k];
    valid = valid && routed >= 0 && routed < experts.experts;
    total += weights[token * top_k + k] * partial[k][threadIdx.x];
  }
  out[token * hidden + row + threadIdx.x] = valid ? total : __int_as_float(0x7fc00000);
}

// ---- one token's MXFP8 experts on the tensor cores (quant/token_moe.cuh) ----
// As quant/fp8_token_moe.cu for FP8 block-128 (read its header): E4M3 codes decoded to F16 by bit operations, the token
// split into two F16 parts, mma.sync m16n8k16, FP32 sums. An E8M0 scale belongs to 32 codes of one row, so an mma's k
// columns must lie in one group: lane (g, c) loads 8 codes of rows g and g + 8 per 32-wide step (four lanes read one
// group), its word j feeding mma j of the step (codes 0 and 2 as k columns 2c, 2c + 1, codes 1 and 3 as 2c + 8,
// 2c + 9), and each step's sums are scaled by their row's E8M0 scale and the split's 1/s.
constexpr int kTokenStep = 32;

// kRing (the default; BEAMLINE_CUDA_TOKEN_MOE=legacy: false): 8 steps per batch instead of 4, since a lane's 8-byte
// loads put half the bytes in flight of FP8's 16-byte ones in the same registers; the batch's
// registers a ring of two halves, each reloaded with the next batch's half as soon as its MMAs have read it; and a
// row's four E8M0 scales of a half in one 32-bit load where the scale rows allow it (k / 32 a multiple of 4),
// instead of one byte load per step and row.
template <bool kRing>
struct Mxfp8Dot {
  static constexpr int kBatch = kRing ? 8 : 4;  // steps loaded before the first is used
  static constexpr int kHalf = kBatch / 2;      // kRing: the steps whose scales one 32-bit word holds
  static_assert(!kRing || kHalf == 4, "a half's scales are the four bytes of one word");
  struct Batch {
    uint2 codes[kBatch][2][2];
    // kRing: [half][i][r], the half's four scale bytes (step u in bits 8 (u % 4)); else [step][i][r].
    uint32_t scales[kRing ? 2 : kBatch][2][2];
  };
  // Tile i's rows: row[i][r] of the matrices at code_base[i] (k codes a row) and scale_base[i] (k / 32 scales), as
  // bases and row indices rather than eight pointers: the ring's registers leave no room for those.
  const uint8_t* code_base[2];
  const uint8_t* scale_base[2];
  int32_t row[2][2];
  int32_t k;
  bool packed_scales;

  static __device__ Mxfp8Dot make(const Experts& experts, int32_t e, const int (&matrix)[2],
                                  const int64_t (&first_row)[2], int64_t row_count, int64_t k, int g) {
    Mxfp8Dot dot;
    dot.k = static_cast<int32_t>(k);
    dot.packed_scales = false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      dot.code_base[i] = experts.codes[matrix[i]][e];
      dot.scale_base[i] = experts.scales[matrix[i]][e];
#pragma unroll
      for (int r = 0; r < 2; ++r) dot.row[i][r] = static_cast<int32_t>(min(first_row[i] + g + 8 * r, row_count - 1));
    }
    if constexpr (kRing)
      dot.packed_scales = (k / Mxfp8Chunk::kGroup) % 4 == 0 && reinterpret_cast<uintptr_t>(dot.scale_base[0]) % 4 == 0 &&
                          reinterpret_cast<uintptr_t>(dot.scale_base[1]) % 4 == 0;
    return dot;
  }
  __device__ __forceinline__ const uint8_t* codes(int i, int r) const {
    return code_base[i] + int64_t{row[i][r]} * k;
  }
  __device__ __forceinline__ const uint8_t* scales(int i, int r) const {
    return scale_base[i] + int64_t{row[i][r]} * (k / Mxfp8Chunk::kGroup);
  }

  // Steps first_step + u for u in [kFrom, kTo) (kRing: one half, kFrom a multiple of kHalf).
  template <int kFrom = 0, int kTo = kBatch>
  __device__ __forceinline__ void load(int first_step, int c, Batch& batch) const {
    const int64_t steps = k / kTokenStep;
#pragma unroll
    for (int u = kFrom; u < kTo; ++u) {
      const int64_t step = first_step + u, column = step * kTokenStep + 8 * c;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          batch.codes[u][i][r] = column < k ? __ldcs(reinterpret_cast<const uint2*>(codes(i, r) + column)) : uint2{};
          if constexpr (!kRing) batch.scales[u][i][r] = column < k ? __ldg(scales(i, r) + step) : 0u;
        }
    }
    if constexpr (kRing) {
      static_assert(kFrom % kHalf == 0 && kTo % kHalf == 0, "whole halves");
#pragma unroll
      for (int half = kFrom / kHalf; half < kTo / kHalf; ++half) {
        const int64_t step = first_step + half * kHalf;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            uint32_t word = 0;
            if (packed_scales) {  // steps a multiple of 4: a half lies wholly before or past the end
              if (step < steps) word = __ldg(reinterpret_cast<const uint32_t*>(scales(i, r) + step));
            } else {
#pragma unroll
              for (int u = 0; u < kHalf; ++u)
                if (step + u < steps) word |= uint32_t{__ldg(scales(i, r) + step + u)} << (8 * u);
            }
            batch.scales[half][i][r] = word;
          }
      }
    }
  }

  __device__ __forceinline__ uint32_t scale_of(const Batch& batch, int u, int i, int r) const {
    if constexpr (kRing)
      return batch.scales[u / kHalf][i][r] >> (8 * (u % kHalf));  // e8m0_to_float keeps the low byte
    else
      return batch.scales[u][i][r];
  }

  __device__ __forceinline__ void run(const Split& split, int lane, Batch& batch, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4;
    const int steps = static_cast<int>(k / kTokenStep);
    const uint32_t* b_source = g == 0 ? split.hi : split.lo;
    auto step_of = [&](int u, int step) {
      uint4 b{};
      if (g < 2) b = *reinterpret_cast<const uint4*>(b_source + (int64_t{step} * kTokenStep + 8 * c) / 2);
      const float unscale = split.unscale[step * kTokenStep / kSplitBlock];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float d[4] = {};
        uint32_t a[4];  // row g k (2c, 2c+1), row g+8 (2c, 2c+1), row g (2c+8, 2c+9), row g+8 (2c+8, 2c+9)
        e4m3x4_to_half2(batch.codes[u][i][0].x, a[0], a[2]);
        e4m3x4_to_half2(batch.codes[u][i][1].x, a[1], a[3]);
        mma_f16(d, a, b.x, b.y);
        e4m3x4_to_half2(batch.codes[u][i][0].y, a[0], a[2]);
        e4m3x4_to_half2(batch.codes[u][i][1].y, a[1], a[3]);
        mma_f16(d, a, b.z, b.w);
        // Column 0 is hi, column 1 lo (lanes c = 0); the other lanes' columns are zero.
        total[i][0] += (d[0] + d[1]) * (e8m0_to_float(scale_of(batch, u, i, 0)) * unscale);
        total[i][1] += (d[2] + d[3]) * (e8m0_to_float(scale_of(batch, u, i, 1)) * unscale);
      }
    };
    stream_ring<kRing, kBatch>(*this, steps, c, batch, step_of, [](int, int) {});
  }
};

// ---- one token's NVFP4 experts on the tensor cores (quant/token_moe.cuh) ----
// Before this (BEAMLINE_CUDA_TOKEN_MOE=legacy) one NVFP4 token took the CUDA-core streaming kernels above: every code
// decoded to F32 and multiplied on the FMA pipe, every lane reading 32 activations from L1 per 16 bytes of codes: far
// from the bytes floor. Here as for FP8 and MXFP8: mma.sync m16n8k16 on F16 operands against the token's
// F16 split. An E4M3 scale belongs to 16 codes, and the four lanes of one mma read from four groups, so the scale
// goes into the A operand: e2m1 times e4m3 has at most 6 significant bits and lies in [2^-10, 2688], exact in F16.
// Lane (g, c) loads 32 codes (16 bytes) of rows g and g + 8 per 128-wide step and their two scales (one 16-bit
// load); code quad q of its chunk (elements 4q..4q+3, nibbles of one half-word) feeds mma q, codes 0 and 2 as k
// columns 2c, 2c + 1 and codes 1 and 3 as 2c + 8, 2c + 9, the split read in that order (activation_split.cuh).
// Rows of width k a multiple of 32 (a lane's chunk is wholly inside a row or past it); scale_2 applied to the sums.
constexpr int kNvfp4Step = 128;  // k per step: four lanes x 32 codes

// Four E2M1 codes (the half-word `half` of w) as exact F16 pairs: codes 0 and 2 in `even`, 1 and 3 in `odd`. The
// magnitude's F16 has a zero low byte, so one byte permutation looks the high bytes up in an 8-entry table and puts
// them in bytes 1 and 3; the sign bits are moved in by a shift and a mask.
__device__ __forceinline__ void e2m1x4_to_half2(uint32_t w, int half, uint32_t& even, uint32_t& odd) {
  constexpr uint32_t kLow = 0x3e3c3800u, kHigh = 0x46444240u;  // F16 high bytes of 0, 0.5, 1, 1.5 | 2, 3, 4, 6
  const uint32_t quad = half == 0 ? w : w >> 16;                 // codes 0..3 in bits 0-15
  const uint32_t spread = __byte_perm(quad, 0, 0x4140);          // codes 0, 1 in bits 0-7, codes 2, 3 in bits 16-23
  even = __byte_perm(kLow, kHigh, (quad << 4) & 0x7070u) | ((spread << 12) & 0x80008000u);
  odd = __byte_perm(kLow, kHigh, quad & 0x7070u) | ((spread << 8) & 0x80008000u);
}

// d += one tile's chunk of 32 codes in rows g (`low`) and g + 8 (`high`), the words of quads 2w, 2w + 1 feeding mmas
// 2w and 2w + 1, times the split from b_source at element `column` (lanes g < 2 load it; the others' columns are
// zero); scale_pairs[r]: the chunk's two E4M3 group scales of row g + 8 r (the low byte first).
__device__ __forceinline__ void nvfp4_chunk_mma(const uint32_t (&low)[4], const uint32_t (&high)[4],
                                                const uint32_t (&scale_pairs)[2], const uint32_t* b_source,
                                                int64_t column, int g, float (&d)[4]) {
  __half2 scale[2][2];  // [r][group]: the group's scale in both halves
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(scale_pairs[r]), __NV_E4M3);
    const __half2 both = *reinterpret_cast<const __half2*>(&raw);
    scale[r][0] = __low2half2(both);
    scale[r][1] = __high2half2(both);
  }
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint4 b{};  // the split's words of elements 8w..8w+7 of the chunk: quads 2w, 2w + 1
    if (g < 2) b = *reinterpret_cast<const uint4*>(b_source + (column + 8 * w) / 2);
    const uint32_t b_regs[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      uint32_t a[4];  // row g k (2c, 2c+1), row g+8 (2c, 2c+1), row g (2c+8, 2c+9), row g+8 (2c+8, 2c+9)
      e2m1x4_to_half2(low[w], q, a[0], a[2]);
      e2m1x4_to_half2(high[w], q, a[1], a[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __half2 scaled = __hmul2(*reinterpret_cast<const __half2*>(&a[j]), scale[j & 1][w / 2]);
        a[j] = *reinterpret_cast<const uint32_t*>(&scaled);
      }
      mma_f16(d, a, b_regs[2 * q], b_regs[2 * q + 1]);
    }
  }
}

struct Nvfp4Dot {
  // Steps in flight: a ring of two halves of one step (4 KiB a warp); two steps a half spill at 128 registers.
  static constexpr int kBatch = 2;
  struct Batch {
    uint4 codes[kBatch][2][2];
    uint32_t scales[kBatch][2][2];  // the chunk's two E4M3 scales
  };
  const uint8_t* code_base[2];
  const uint8_t* scale_base[2];
  int32_t row[2][2];
  int32_t k;
  float scale_2[2];

  static __device__ Nvfp4Dot make(const Experts& experts, int32_t e, const int (&matrix)[2],
                                  const int64_t (&first_row)[2], int64_t row_count, int64_t k, int g) {
    Nvfp4Dot dot;
    dot.k = static_cast<int32_t>(k);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      dot.code_base[i] = experts.codes[matrix[i]][e];
      dot.scale_base[i] = experts.scales[matrix[i]][e];
      dot.scale_2[i] = experts.scale_2[matrix[i]] != nullptr ? *experts.scale_2[matrix[i]][e] : 1.0f;
#pragma unroll
      for (int r = 0; r < 2; ++r) dot.row[i][r] = static_cast<int32_t>(min(first_row[i] + g + 8 * r, row_count - 1));
    }
    return dot;
  }

  template <int kFrom = 0, int kTo = kBatch>
  __device__ __forceinline__ void load(int first_step, int c, Batch& batch) const {
#pragma unroll
    for (int u = kFrom; u < kTo; ++u) {
      const int64_t column = int64_t{first_step + u} * kNvfp4Step + 32 * c;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t offset = int64_t{row[i][r]} * k + column;  // in elements
          batch.codes[u][i][r] = column < k ? load_streaming(code_base[i] + offset / 2) : uint4{};
          batch.scales[u][i][r] =
              column < k ? __ldg(reinterpret_cast<const unsigned short*>(scale_base[i] + offset / 16)) : 0u;
        }
    }
  }

  __device__ __forceinline__ void run(const Split& split, int lane, Batch& batch, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4;
    const int steps = (k + kNvfp4Step - 1) / kNvfp4Step;
    const uint32_t* b_source = g == 0 ? split.hi : split.lo;
    auto step_of = [&](int u, int step) {
      const float unscale = split.unscale[step];  // a step is one 128-wide block of the split
      float d[2][4] = {};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t low[4] = {batch.codes[u][i][0].x, batch.codes[u][i][0].y, batch.codes[u][i][0].z,
                                 batch.codes[u][i][0].w};
        const uint32_t high[4] = {batch.codes[u][i][1].x, batch.codes[u][i][1].y, batch.codes[u][i][1].z,
                                  batch.codes[u][i][1].w};
        const uint32_t scale_pairs[2] = {batch.scales[u][i][0], batch.scales[u][i][1]};
        nvfp4_chunk_mma(low, high, scale_pairs, b_source, int64_t{step} * kNvfp4Step + 32 * c, g, d[i]);
      }
      // Column 0 is hi, column 1 lo (lanes c = 0); the other lanes' columns are zero.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        total[i][0] += (d[i][0] + d[i][1]) * unscale;
        total[i][1] += (d[i][2] + d[i][3]) * unscale;
      }
    };
    stream_ring<true, kBatch>(*this, steps, c, batch, step_of, [](int, int) {});
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      total[i][0] *= scale_2[i];
      total[i][1] *= scale_2[i];
    }
  }
};

bool nvfp4_token_supported(int64_t hidden, int64_t intermediate) { return hidden % 32 == 0 && intermediate % 32 == 0; }

// ---- the same products with the weights staged through shared memory (quant/staged_moe.cuh) ----
// What the MXFP8 and NVFP4 stages share: codes and scale rows of the two tiles, rows clamped to the last.
struct MicroRows {
  const uint8_t* codes[2];
  const uint8_t* scales[2];
  int64_t first_row[2];
  int64_t row_count, k;

  __device__ void set(const Experts& experts, int32_t e, const int (&matrix)[2], const int64_t (&first)[2],
                      int64_t rows, int64_t width) {
    row_count = rows;
    k = width;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      codes[i] = experts.codes[matrix[i]][e];
      scales[i] = experts.scales[matrix[i]][e];
      first_row[i] = first[i];
    }
  }
  __device__ int64_t row(int i, int t) const { return min(first_row[i] + t, row_count - 1); }
};

// MXFP8: a stage is 128 codes of each row (four of Mxfp8Dot's 32-wide steps, one 128-wide block of the split) and the
// row's four E8M0 scales of them, one 4-byte copy per row (k a multiple of 128, scale tensors 4-byte aligned). Lane
// (g, c) reads for step v the 8 codes at 32 v + 8 c of its rows, as Mxfp8Dot does: words x and y are k groups
// 8 v + 2 c and + 1, so a word's parity is its index's (kWords: the words decoded by cvt, mma_f16.cuh).
template <CvtWords kWords>
struct Mxfp8Stage : MicroRows {
  using Operand = SplitOperand<kWords>;
  static constexpr int kStageK = 128;
  static constexpr int kScaleBytes = kStagedRows * 4;

  static __device__ Mxfp8Stage make(const Experts& experts, int32_t e, const int (&matrix)[2],
                                    const int64_t (&first)[2], int64_t rows, int64_t k) {
    Mxfp8Stage stage;
    stage.set(experts, e, matrix, first, rows, k);
    return stage;
  }
  __device__ int64_t row_bytes() const { return k; }
  __device__ const uint8_t* row_codes(int i, int t) const { return codes[i] + row(i, t) * k; }
  __device__ void copy_scales(int stage, unsigned char* target, int lane) const {
    const int t = lane % kTokenTileRows;  // row `lane` of the stage: row t of tile lane / 16, picked by selects
    const bool first = lane < kTokenTileRows;
    const uint8_t* base = first ? scales[0] : scales[1];
    const int64_t r = first ? row(0, t) : row(1, t);
    copy_async4(target + 4 * lane, base + r * (k / Mxfp8Chunk::kGroup) + 4 * stage, true);
  }

  __device__ __forceinline__ void consume(const unsigned char* stage_codes, const unsigned char* stage_scales, int s,
                                          const Split& split, int lane, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4, swizzle = stage_swizzle(g);
    const uint32_t* b_source = g == 0 ? split.hi : split.lo;
    const float unscale = split.unscale[s];
#pragma unroll
    for (int v = 0; v < kStageK / kTokenStep; ++v) {
      uint4 b{};
      if (g < 2) b = *reinterpret_cast<const uint4*>(b_source + (int64_t{s} * kStageK + kTokenStep * v + 8 * c) / 2);
      const int offset = 16 * ((2 * v + c / 2) ^ swizzle) + 8 * (c % 2);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row_g = kTokenTileRows * i + g, row_g8 = row_g + 8;
        const uint2 low = *reinterpret_cast<const uint2*>(stage_codes + row_g * kStageRowBytes + offset);
        const uint2 high = *reinterpret_cast<const uint2*>(stage_codes + row_g8 * kStageRowBytes + offset);
        float d[4] = {};
        uint32_t a[4];  // row g k (2c, 2c+1), row g+8 (2c, 2c+1), row g (2c+8, 2c+9), row g+8 (2c+8, 2c+9)
        e4m3_word<kWords>(low.x, 0, a[0], a[2]);
        e4m3_word<kWords>(high.x, 0, a[1], a[3]);
        mma_f16(d, a, b.x, b.y);
        e4m3_word<kWords>(low.y, 1, a[0], a[2]);
        e4m3_word<kWords>(high.y, 1, a[1], a[3]);
        mma_f16(d, a, b.z, b.w);
        // Column 0 is hi, column 1 lo (lanes c = 0); the other lanes' columns are zero.
        total[i][0] += (d[0] + d[1]) * (e8m0_to_float(stage_scales[4 * row_g + v]) * unscale);
        total[i][1] += (d[2] + d[3]) * (e8m0_to_float(stage_scales[4 * row_g8 + v]) * unscale);
      }
    }
  }
  __device__ void finish(float (&)[2][2]) const {}
};

// NVFP4: a stage is 256 codes of each row (two of Nvfp4Dot's 128-wide steps) and their 16 E4M3 scales, four 4-byte
// copies per row (k a multiple of 64, scale tensors 4-byte aligned). Lane (g, c) reads for step u the 32 codes at
// 128 u + 32 c of its rows (chunk 4u + c) and their two scales, as Nvfp4Dot does; steps past k are skipped (the
// split ends with the last 128-wide block).
struct Nvfp4Stage : MicroRows {
  using Operand = SplitOperand<>;
  static constexpr int kStageK = 2 * kNvfp4Step;
  static constexpr int kScaleBytes = kStagedRows * kStageK / 16;
  float scale_2[2];

  static __device__ Nvfp4Stage make(const Experts& experts, int32_t e, const int (&matrix)[2],
                                    const int64_t (&first)[2], int64_t rows, int64_t k) {
    Nvfp4Stage stage;
    stage.set(experts, e, matrix, first, rows, k);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      stage.scale_2[i] = experts.scale_2[matrix[i]] != nullptr ? *experts.scale_2[matrix[i]][e] : 1.0f;
    return stage;
  }
  __device__ int64_t row_bytes() const { return k / 2; }
  __device__ const uint8_t* row_codes(int i, int t) const { return codes[i] + row(i, t) * (k / 2); }
  __device__ void copy_scales(int stage, unsigned char* target, int lane) const {
    const int w = lane % 4;  // the word of 4 scales (64 codes) at 4 w in the row's 16 bytes of the stage
    const bool valid = int64_t{stage} * kStageK + 64 * w < k;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int t = lane / 4 + 8 * m;  // row t % 16 of tile m / 2
      copy_async4(target + 16 * t + 4 * w,
                  scales[m / 2] + row(m / 2, t % kTokenTileRows) * (k / 16) + 16 * int64_t{stage} + 4 * w, valid);
    }
  }

  __device__ __forceinline__ void consume(const unsigned char* stage_codes, const unsigned char* stage_scales, int s,
                                          const Split& split, int lane, float (&total)[2][2]) const {
    const int g = lane / 4, c = lane % 4, swizzle = stage_swizzle(g);
    const uint32_t* b_source = g == 0 ? split.hi : split.lo;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int step = 2 * s + u;
      if (int64_t{step} * kNvfp4Step >= k) break;
      const float unscale = split.unscale[step];  // a step is one 128-wide block of the split
      const int chunk = 16 * ((4 * u + c) ^ swizzle);
      float d[2][4] = {};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int rows[2] = {kTokenTileRows * i + g, kTokenTileRows * i + 8 + g};
        const uint4 row_g = *reinterpret_cast<const uint4*>(stage_codes + rows[0] * kStageRowBytes + chunk);
        const uint4 row_g8 = *reinterpret_cast<const uint4*>(stage_codes + rows[1] * kStageRowBytes + chunk);
        const uint32_t low[4] = {row_g.x, row_g.y, row_g.z, row_g.w};
        const uint32_t high[4] = {row_g8.x, row_g8.y, row_g8.z, row_g8.w};
        uint32_t scale_pairs[2];  // the chunk's two scales at 8u + 2c of the row's 16 bytes in the stage
#pragma unroll
        for (int r = 0; r < 2; ++r)
          scale_pairs[r] = *reinterpret_cast<const unsigned short*>(stage_scales + 16 * rows[r] + 8 * u + 2 * c);
        nvfp4_chunk_mma(low, high, scale_pairs, b_source, int64_t{step} * kNvfp4Step + 32 * c, g, d[i]);
      }
      // Column 0 is hi, column 1 lo (lanes c = 0); the other lanes' columns are zero.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        total[i][0] += (d[i][0] + d[i][1]) * unscale;
        total[i][1] += (d[i][2] + d[i][3]) * unscale;
      }
    }
  }
  __device__ void finish(float (&total)[2][2]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      total[i][0] *= scale_2[i];
      total[i][1] *= scale_2[i];
    }
  }
};

// The staged kernels take MXFP8 rows of multiples of 128 and NVFP4 rows of multiples of 64, scales 4-byte aligned.
bool staged_widths(const Experts& experts) {
  const int64_t unit = experts.format == Format::Mxfp8 ? 128 : 64;
  return experts.scales_aligned && experts.hidden % unit == 0 && experts.intermediate % unit == 0;
}

// ---- BF16 decode: one thread per 16 elements of a row ----
__global__ void decode_kernel(Format format, Weight weight, int64_t out_rows, int64_t in, __nv_bfloat16* decoded) {
  const int64_t piece = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, per_row = in / 16;
  if (piece >= out_rows * per_row) return;
  const int64_t row = piece / per_row, column = (piece % per_row) * 16;
  float w[16];
  if (format == Format::Mxfp8) {
    unpack_e4m3(*reinterpret_cast<const uint4*>(weight.codes + row * in + column), w);
    const float scale = e8m0_to_float(weight.scales[row * (in / 32) + column / 32]);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] *= scale;
  } else {
    const uint2 bits = *reinterpret_cast<const uint2*>(weight.codes + row * (in / 2) + column / 2);
    unpack_e2m1(bits.x, *reinterpret_cast<float(*)[8]>(w));
    unpack_e2m1(bits.y, *reinterpret_cast<float(*)[8]>(w + 8));
    const float scale = e4m3_to_float(weight.scales[row * (in / 16) + column / 16]) * kE2m1Unscale;
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] *= scale;
  }
  __nv_bfloat162 pairs[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) pairs[i] = __floats2bfloat162_rn(w[2 * i], w[2 * i + 1]);
  auto* target = reinterpret_cast<uint4*>(decoded + row * in + column);
  target[0] = *reinterpret_cast<const uint4*>(&pairs[0]);
  target[1] = *reinterpret_cast<const uint4*>(&pairs[4]);
}

__global__ void scale_outputs_kernel(float* y, int64_t n, const float* scale_2, float softcap) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float value = y[i] * scale_2_of(scale_2);
  if (softcap > 0.0f) value = softcap * tanhf(value / softcap);
  y[i] = value;
}

bool aligned(const void* pointer, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(pointer) % bytes == 0; }

// Calls body(Chunk{}) with the chunk that reads rows of width `in` in `format`.
template <typename Body>
void dispatch_chunk(Format format, int64_t in, Body&& body) {
  if (format == Format::Mxfp8)
    body(Mxfp8Chunk{});
  else if (in % 32 == 0)
    body(Nvfp4Chunk32{});
  else
    body(Nvfp4Chunk16{});
}

}  // namespace

bool supported(Format format, int64_t in) { return in > 0 && in % group_size(format) == 0; }

cudaError_t stream_row(const float* x, const StreamBatch& batch, cudaStream_t stream) {
  if (batch.count < 1 || batch.count > kMaxStreamWeights || !supported(batch.format, batch.in) || !aligned(x, 16))
    return cudaErrorInvalidValue;
  Stacked stacked{};
  stacked.count = batch.count;
  stacked.in = batch.in;
  stacked.softcap = batch.softcap;
  for (int32_t s = 0; s < batch.count; ++s) {
    if (!aligned(batch.weight[s].codes, 16)) return cudaErrorInvalidValue;
    stacked.weight[s] = batch.weight[s];
    stacked.y[s] = batch.y[s];
    stacked.first_row[s + 1] = stacked.first_row[s] + batch.out[s];
  }
  stacked.total_rows = stacked.first_row[batch.count];
  if (stacked.total_rows == 0) return cudaSuccess;
  const auto blocks = blocks_for((stacked.total_rows + kStreamRows - 1) / kStreamRows, kStreamWarps);
  dispatch_chunk(batch.format, batch.in, [&](auto chunk) {
    stream_kernel<decltype(chunk)><<<blocks, kStreamWarps * 32, 0, stream>>>(x, stacked);
  });
  return cudaGetLastError();
}

cudaError_t decode_bf16(Format format, const Weight& weight, int64_t out, int64_t in, __nv_bfloat16* decoded,
                        cudaStream_t stream) {
  if (!supported(format, in) || !aligned(weight.codes, 16) || !aligned(decoded, 16)) return cudaErrorInvalidValue;
  if (out == 0) return cudaSuccess;
  decode_kernel<<<blocks_for(out * (in / 16), 256), 256, 0, stream>>>(format, weight, out, in, decoded);
  return cudaGetLastError();
}

cudaError_t scale_outputs(float* y, int64_t n, const float* scale_2, float softcap, cudaStream_t stream) {
  if (n == 0 || (scale_2 == nullptr && softcap <= 0.0f)) return cudaSuccess;
  scale_outputs_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, n, scale_2, softcap);
  return cudaGetLastError();
}

bool moe_supported(Format format, int64_t hidden, int64_t intermediate) {
  return supported(format, hidden) && supported(format, intermediate);
}

cudaError_t moe_tokens(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                       const Experts& experts, const TokenMoeScratch& scratch, float* out, cudaStream_t stream) {
  if (top_k < 1 || top_k > kMaxTopK || rows * top_k > 0x7fffffff ||
      !moe_supported(experts.format, experts.hidden, experts.intermediate))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  float* activated = scratch.activated;
  const bool one_token = rows == 1 && aligned(h, 16) && aligned(activated, 16);
  const TokenMoeVersion version = token_moe_version();
  if (token_moe_staged(version) && staged_widths(experts) && aligned(h, 16) && aligned(activated, 16) &&
      scratch.partial != nullptr) {
    // Each token reads its experts' weights once, as the streaming kernels below do, but at the staged kernels'
    // bandwidth: with few tokens most routed experts serve one token anyway (16 tokens: ~100 distinct of 128).
    auto launch = [&](auto stage) -> cudaError_t {
      using Stage = decltype(stage);
      if (!staged_token_moe_fits<Stage>(experts.hidden, experts.intermediate, top_k)) return cudaErrorNotSupported;
      for (int64_t first = 0; first < rows; first += kTokenMoeMaxTokens) {
        const auto tokens = static_cast<int32_t>(std::min(kTokenMoeMaxTokens, rows - first));
        TokenMoeScratch part = scratch;
        part.activated = activated + first * top_k * experts.intermediate;
        if (cudaError_t status =
                launch_staged_token_moe<Stage>(h + first * experts.hidden, ids + first * top_k, weights + first * top_k,
                                               tokens, top_k, experts, part, out + first * experts.hidden, stream);
            status != cudaSuccess)
          return status;
      }
      return cudaSuccess;
    };
    const cudaError_t status = experts.format == Format::Nvfp4               ? launch(Nvfp4Stage{})
                               : version == TokenMoeVersion::StagedCvt     ? launch(Mxfp8Stage<CvtWords::All>{})
                               : version == TokenMoeVersion::StagedHalfCvt ? launch(Mxfp8Stage<CvtWords::Even>{})
                                                                           : launch(Mxfp8Stage<CvtWords::None>{});
    if (status != cudaErrorNotSupported) return status;
  }
  const bool register_fits = one_token && token_moe_fits(experts.hidden, experts.intermediate, top_k);
  if (register_fits && experts.format == Format::Mxfp8)
    return version == TokenMoeVersion::Legacy
               ? launch_token_moe<Mxfp8Dot<false>, false>(h, ids, weights, top_k, experts, activated, out, stream)
               : launch_token_moe<Mxfp8Dot<true>, true>(h, ids, weights, top_k, experts, activated, out, stream);
  if (register_fits && experts.format == Format::Nvfp4 && version != TokenMoeVersion::Legacy &&
      nvfp4_token_supported(experts.hidden, experts.intermediate))
    return launch_token_moe<Nvfp4Dot, true>(h, ids, weights, top_k, experts, activated, out, stream);
  // Slots and tokens along x (2^31 - 1 blocks), weight rows along y.
  const dim3 up_grid(static_cast<unsigned int>(rows * top_k),
                     blocks_for((experts.intermediate + kGateUpRows - 1) / kGateUpRows, kGateUpWarps));
  const dim3 down_grid(static_cast<unsigned int>(rows), blocks_for(experts.hidden, kDownRows));
  // Both passes read rows of width hidden (gate, up) and intermediate (down): each picks its own chunk.
  dispatch_chunk(experts.format, experts.hidden, [&](auto chunk) {
    gate_up_kernel<decltype(chunk)><<<up_grid, kGateUpWarps * 32, 0, stream>>>(h, ids, top_k, experts, activated);
  });
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  dispatch_chunk(experts.format, experts.intermediate, [&](auto chunk) {
    down_kernel<decltype(chunk)><<<down_grid, top_k * 32, 0, stream>>>(activated, ids, weights, top_k, experts, out);
  });
  return cudaGetLastError();
}

}  // namespace beamline::cuda::micro
