#pragma once
// FP8 block-128 weights on the CUDA backend (MODEL_FORMAT.md section 5, "fp8" with weight_block_size [128, 128]:
// W = e4m3 * scale per 128x128 block, scale F32 [ceil(out/128), ceil(in/128)]). Launchers internal to
// backend/cuda, like kernels.h: raw device pointers the backend has validated, enqueued on `stream`, the launch's
// error returned.
//
// Numerics, per path:
//  - W8A16 (weight streaming, few rows: decode projections, the LM head, a one-token MoE): every weight is
//    dequantized exactly in registers (e4m3 * its block scale) and dotted with the F32 activations in FP32 (the
//    one-token MoE: on the tensor cores, the activations split exactly enough into two F16 parts). Equal to the CPU
//    backend's exact-dequant reference up to summation order.
//  - W8A8 (FP8 wgmma, more rows: prefill projections, the MoE from two tokens on): the activations are quantized per
//    token and 128 channels to E4M3 with an F32 scale (quantize_rows), each 128-wide k block is summed on the tensor
//    cores (e4m3 x e4m3 -> FP32) and promoted into an FP32 total with both block scales after every k block
//    (DeepSeek-V3 / DeepGEMM's scheme: the tensor cores' FP8 accumulation keeps fewer bits than FP32, so no partial
//    sum spans more than 128 products). Equal to a host emulation (activations through the reference quantizer,
//    weights dequantized, FP32 sums) up to summation order; against exact dequant it carries the E4M3 rounding of
//    the activations (a few percent relative).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/quant/token_moe.h"

namespace beamline::cuda::fp8 {

constexpr int64_t kBlock = 128;  // the quantization block along k (activations and weights) and along weight rows
constexpr float kE4m3Max = 448.0f;
constexpr float kMinScaledAmax = 1e-10f;  // quant/element_codes.h: an all-zero block's scale stays normal
constexpr int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }

// ---- activations ----
// q[r, c] = e4m3(x[r, c] / s[r, c / 128]) with s = max(amax, 1e-10) / 448 over the row's 128-channel block (a true
// division, round to nearest even, saturating at 448): quant/activation_quant.h's definition, bit for bit. x [rows, cols] F32 16-byte aligned, q [rows, cols], scales
// [rows, ceil(cols / 128)]. cols a multiple of 16 (the GEMMs' 16-byte row pieces).
bool quantize_supported(int64_t cols);
cudaError_t quantize_rows(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales, cudaStream_t stream);
// The same codes and scales with the scales token-major, [ceil(cols / 128), rows] (scales[b * rows + r]): the layout
// of cuBLASLt's per-128-channel (VEC128_32F) operand scales (fp8_cublaslt.h).
cudaError_t quantize_rows_token_major(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                                      cudaStream_t stream);

// out[i] = e4m3(normal_value(key, i, mean, stddev)) (util/counter_random.h; round to nearest even, saturating): random
// FP8 codes drawn on the device, for benchmarks of FP8 weights without a checkpoint.
cudaError_t fill_random_e4m3(uint8_t* out, int64_t n, uint64_t key, float mean, float stddev, cudaStream_t stream);

// ---- weight streaming (W8A16), 1..kMaxStreamRows rows ----
// ys[s] = x W_sᵀ for up to kMaxStreamWeights FP8 weights W_s [out_s, in] of one width (16-byte aligned, in a
// multiple of 16) in one launch that reads every weight byte once; softcap > 0 stores softcap * tanh(y / softcap).
constexpr int kMaxStreamWeights = 4;
constexpr int64_t kMaxStreamRows = 2;
struct StreamBatch {
  const uint8_t* weight[kMaxStreamWeights] = {};
  const float* scale[kMaxStreamWeights] = {};
  float* y[kMaxStreamWeights] = {};
  int64_t out[kMaxStreamWeights] = {};
  int32_t count = 0;
  int64_t in = 0;
  float softcap = 0.0f;
};
bool stream_supported(int64_t rows, int64_t in);
cudaError_t stream_rows(const float* x, int64_t rows, const StreamBatch& batch, cudaStream_t stream);

// ---- FP8 wgmma GEMMs (W8A8) ----
// A weight as the GEMMs read it: the matrix through a TMA tensor map (boxes of 64 rows x 128 k, 128-byte swizzle)
// and its block scales.
constexpr size_t kTensorMapBytes = 128;
// Encodes the map of an FP8 weight [rows, cols] (cols a multiple of 16, the weight 16-byte aligned) into the
// kTensorMapBytes at host address `map`.
cudaError_t encode_weight_map(const void* weight, int64_t rows, int64_t cols, void* map);
bool gemm_supported(int64_t in);  // in a multiple of 16

// y[r, o] = sum_k xq[r, k] xs[r, k/128] * w[o, k] ws[o/128, k/128], the sums promoted per 128-wide k block; softcap
// as in stream_rows. xq [rows, in] E4M3 and xs from quantize_rows; y [rows, out] F32.
cudaError_t linear(const uint8_t* xq, const float* xs, int64_t rows, int64_t in, const void* weight,
                   const float* weight_scale, int64_t out, float softcap, float* y, cudaStream_t stream);
// activated[r, i] = silu(gate_r · x) * (up_r · x) with the same sums (the dense SwiGLU's first half). gate and up
// [inter, in]; activated [rows, inter] F32.
cudaError_t gate_up(const uint8_t* xq, const float* xs, int64_t rows, int64_t in, const void* gate,
                    const float* gate_scale, const void* up, const float* up_scale, int64_t inter, float* activated,
                    cudaStream_t stream);

// ---- the routed experts ----
// Device tables of one MoE layer's FP8 experts (CudaBackend::prepare_moe): the weight pointers, the scale pointers
// and the tensor maps of the gate, up and down matrices, each [E].
struct Experts {
  const void* const* weight[3] = {};
  const float* const* scale[3] = {};
  const unsigned char* maps[3] = {};  // kTensorMapBytes each, 64-byte aligned
  int32_t experts = 0;
  int64_t hidden = 0, intermediate = 0;
};
bool moe_supported(int32_t experts, int64_t hidden, int64_t intermediate);

// One token (decode at batch 1) with top_k <= 8, W8A16 on the tensor cores (fp8_token_moe.cu: exact weights in F16,
// the F32 activations split into two F16 parts, FP32 sums): gate|up of every routed expert in one launch with the
// SwiGLU fused (scratch.activated), then down of every routed expert in a second with the combine fused, in j order
// (the staged version: through scratch.partial and scratch.counters, token_moe.h). Expert ids out of range make the
// output NaN. h and scratch.activated 16-byte aligned. Supported when the activation splits fit in shared memory
// (H up to ~58K; I up to ~7K at top_k 8).
constexpr int32_t kMaxStreamTopK = 8;
bool moe_one_token_supported(int64_t hidden, int64_t intermediate, int32_t top_k);
cudaError_t moe_one_token(const float* h, const int32_t* ids, const float* weights, int32_t top_k,
                          const Experts& experts, const TokenMoeScratch& scratch, float* out, cudaStream_t stream);

// Any number of tokens, W8A8 on wgmma: h quantized, the slots grouped by expert into tiles of tile_tokens tokens,
// gate|up with the SwiGLU fused (F32 out), that quantized, down with the routing weight fused, then the combine in
// j order (moe/moe.h moe_combine). Scratch sizes for `assignments` = rows * top_k slots:
struct MoeWorkspace {
  uint8_t* h_q = nullptr;         // [rows, H]
  float* h_scale = nullptr;       // [rows, ceil(H/128)]
  int32_t* grouped = nullptr;     // [assignments]
  int32_t* tiles = nullptr;       // [max_tiles, 4]
  float* activated = nullptr;     // [assignments, I]
  uint8_t* activated_q = nullptr; // [assignments, I]
  float* activated_scale = nullptr;  // [assignments, ceil(I/128)]
  float* expert_out = nullptr;    // [assignments, H]
  int64_t max_tiles = 0;          // moe_max_tiles(assignments, experts)
};
int64_t moe_max_tiles(int64_t assignments, int32_t experts);
cudaError_t moe(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                const Experts& experts, const MoeWorkspace& workspace, float* out, cudaStream_t stream);

}  // namespace beamline::cuda::fp8
