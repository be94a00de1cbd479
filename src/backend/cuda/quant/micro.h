#pragma once
// MXFP8 and NVFP4 weights on the CUDA backend (MODEL_FORMAT.md section 5): the two layouts with a scale per few
// elements of a row ("micro" scales). Launchers internal to backend/cuda, like fp8.h: raw device pointers the backend
// has validated, enqueued on `stream`, the launch's error returned.
//  - MXFP8: E4M3 codes [out, in], an E8M0 scale per 32 elements of a row [out, in/32]: W = e4m3 * 2^(e - 127).
//  - NVFP4: E2M1 codes packed two per byte, element 2j in the low nibble of byte j [out, in/2], an E4M3 scale per 16
//    elements [out, in/16] and an F32 scale_2 per tensor: W = e2m1 * e4m3(b) * scale_2.
//
// Numerics: weight-only. Every path sums F32 activations times the exact weights in FP32 and applies the scales to
// the partial sums (per scale group, then scale_2 per output): equal to the CPU backend's exact-dequant reference up
// to summation order and one rounding per group.
//  - streaming (one row: decode projections, the LM head, the dense SwiGLU, the MoE token by token): each weight byte
//    read once with 16-byte loads (8-byte for NVFP4 rows whose width is not a multiple of 32), decoded in registers;
//    a warp owns several weight rows so that each activation load serves all of them. NVFP4 reads 4.5 bits a weight.
//  - more rows: the weight decoded once into BF16 scratch (exact: E4M3 times a power of two, and E2M1 times E4M3, fit
//    BF16's 8 bits; NVFP4's scale_2 is applied to the outputs instead) and the BF16 GEMMs of the unquantized path.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/quant/token_moe.h"

namespace beamline::cuda::micro {

enum class Format : int32_t { Mxfp8, Nvfp4 };

constexpr int64_t group_size(Format format) { return format == Format::Mxfp8 ? 32 : 16; }

// One quantized weight on the device. scale_2: NVFP4's per-tensor F32 (a device scalar); null for MXFP8.
struct Weight {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const float* scale_2 = nullptr;
};

// ---- weight streaming, one row ----
// ys[s] = x W_sᵀ for up to kMaxStreamWeights weights W_s [out_s, in] of one format and width in one launch;
// softcap > 0 stores softcap * tanh(y / softcap). x 16-byte aligned.
constexpr int kMaxStreamWeights = 4;
struct StreamBatch {
  Format format = Format::Mxfp8;
  Weight weight[kMaxStreamWeights] = {};
  float* y[kMaxStreamWeights] = {};
  int64_t out[kMaxStreamWeights] = {};
  int32_t count = 0;
  int64_t in = 0;
  float softcap = 0.0f;
};
// in a multiple of the format's group (what the layout requires), codes 16-byte aligned.
bool supported(Format format, int64_t in);
cudaError_t stream_row(const float* x, const StreamBatch& batch, cudaStream_t stream);

// ---- more rows: BF16 decode for the unquantized GEMMs ----
// out[r, c] = e4m3(code) * 2^(e - 127) (MXFP8) or e2m1(code) * e4m3(b) (NVFP4, without scale_2), exactly, as BF16.
cudaError_t decode_bf16(Format format, const Weight& weight, int64_t out, int64_t in, __nv_bfloat16* decoded,
                        cudaStream_t stream);
// y[i] = y[i] * scale_2 (when not null), then soft-capped when softcap > 0.
cudaError_t scale_outputs(float* y, int64_t n, const float* scale_2, float softcap, cudaStream_t stream);

// ---- the routed experts, token by token ----
// Device tables of one MoE layer's experts: codes, scales and (NVFP4) scale_2 pointers of gate, up, down, each [E].
struct Experts {
  Format format = Format::Mxfp8;
  const uint8_t* const* codes[3] = {};
  const uint8_t* const* scales[3] = {};
  const float* const* scale_2[3] = {};  // null tables for MXFP8
  int32_t experts = 0;
  int64_t hidden = 0, intermediate = 0;
  bool scales_aligned = false;  // every scale tensor 4-byte aligned (the staged one-token kernels copy scale words)
};
constexpr int32_t kMaxTopK = 8;
bool moe_supported(Format format, int64_t hidden, int64_t intermediate);
// For every token t: activated[t, j, :] = silu(gate_e h_t) * (up_e h_t) for e = ids[t, j], then
// out[t] = sum over j in order of weights[t, j] * down_e activated[t, j]. Each token streams its experts' weights
// (one token: every routed weight byte read once), all its experts in one launch per pass (the down pass: a warp per
// routed expert, the combine in j order). One token of MXFP8, and of NVFP4 with widths that are multiples of 32, runs
// on the tensor cores (token_moe.cuh) unless BEAMLINE_CUDA_TOKEN_MOE=legacy. By default, MXFP8 widths that are
// multiples of 128 and NVFP4 ones of 64 take the staged kernels (staged_moe.cuh) at every row count, in calls of
// kTokenMoeMaxTokens tokens: each token still reads its experts, at their bandwidth. An expert id out of range makes its
// token's output NaN. scratch.activated [rows * top_k, I]; scratch.partial and scratch.counters for
// min(rows, kTokenMoeMaxTokens) tokens (token_moe.h; null partial: no staged kernels).
cudaError_t moe_tokens(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                       const Experts& experts, const TokenMoeScratch& scratch, float* out, cudaStream_t stream);

}  // namespace beamline::cuda::micro
