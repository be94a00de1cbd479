#pragma once
// The routed experts (the router that picks them: router.h): grouped GEMMs on mma.sync and wgmma (moe_mma.cu), weight
// streaming for few tokens (moe_streaming.cu), the shared steps (moe.cu).
// Conventions: backend/cuda/common/operand_precision.h.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "backend/cuda/common/operand_precision.h"
#include "backend/cuda/quant/token_moe.h"
#include "tensor/dtype.h"

namespace beamline::cuda {

// Rows of the grouped GEMMs are padded per expert to a multiple of this tile height.
constexpr int32_t kGroupedTileRows = 64;

// Device pointers of each expert's weights, in the stored dtype (BF16 or F16, all experts alike).
struct ExpertPointers {
  const void* const* gate = nullptr;  // [E] -> [I, H]
  const void* const* up = nullptr;    // [E] -> [I, H]
  const void* const* down = nullptr;  // [E] -> [H, I]
  DType dtype = DType::BF16;
  int32_t experts = 0;
  int64_t hidden = 0, intermediate = 0;
  // [3, E] TMA descriptors of the gate, up and down matrices (encode_expert_tensor_map), for the wgmma GEMMs of
  // moe_mma; null: those GEMMs are not used.
  const void* tensor_maps = nullptr;
};

// The hooks through which moe_lora (lora/moe_lora.h) adds each slot's expert LoRA inside these kernels, so that its
// base GEMMs are moe's own (slot s = token * top_k + j). The SwiGLU output of slot s as the down GEMM reads it: F32
// rows, or `term_count` BF16 row sets (1: hi; kSplitTerms with OperandPrecision::Split: hi, lo, lo2, whose sum is the
// F32 value), set t at terms + t * term_stride elements; row s, or slot_row[s] when set (moe's padded rows).
struct SwigluRows {
  const float* f32 = nullptr;
  const __nv_bfloat16* terms = nullptr;
  int32_t term_count = 0;
  int64_t term_stride = 0;
  const int32_t* slot_row = nullptr;
};
// F32 deltas, each null for none: `gate_up` [A, 2 I], slot s's on its gate (first I) and up pre-activations, added
// before the SwiGLU; `down` [A, H], slot s's on its down output, added before the routing weight. `compute_down`,
// when set, is called between the gate|up and the down launches with the SwiGLU output: it launches what writes
// `down`.
struct ExpertDeltas {
  const float* gate_up = nullptr;
  const float* down = nullptr;
  std::function<cudaError_t(const SwigluRows&)> compute_down;
};
inline const float* gate_up_delta(const ExpertDeltas* deltas) { return deltas != nullptr ? deltas->gate_up : nullptr; }
inline const float* down_delta(const ExpertDeltas* deltas) { return deltas != nullptr ? deltas->down : nullptr; }
inline cudaError_t compute_down_delta(const ExpertDeltas* deltas, const SwigluRows& rows) {
  return deltas != nullptr && deltas->compute_down ? deltas->compute_down(rows) : cudaSuccess;
}

// Scratch of one MoE call for (rows * top_k) assignments, max_tiles from moe_max_tiles.
struct MoeWorkspace {
  int32_t* counts = nullptr;       // [E]
  int32_t* cursor = nullptr;       // [E]
  int32_t* offsets = nullptr;      // [E] first padded row of each expert
  int32_t* tile_expert = nullptr;  // [max_tiles] expert of each row tile, -1 past the last
  int32_t* slot_row = nullptr;     // [rows * top_k] padded row of each (token, j)
  int32_t* row_token = nullptr;    // [max_tiles * tile] token feeding each padded row, -1 for padding
  int32_t* row_slot = nullptr;     // [max_tiles * tile] the same as slots, -1 for padding (with ExpertDeltas only)
  float* activated = nullptr;      // [max_tiles * tile, I]
  float* expert_out = nullptr;     // [max_tiles * tile, H]
  int64_t max_tiles = 0;
};
int64_t moe_max_tiles(int64_t assignments, int32_t experts);

// out[t] = sum_j weights[t, j] * SwiGLU_{ids[t, j]}(h[t]) with no host synchronisation: count, pad and
// map the rows per expert, two grouped GEMMs reading h through the map (gate|up with the SwiGLU fused, then down;
// F32 activations onto the tensor cores as kSplitTerms operands with OperandPrecision::Split, hi + lo with Bf16),
// combine in j order. Expert ids outside [0, E) make the
// token's output NaN. `deltas` (moe_lora): workspace.row_slot must be set.
cudaError_t moe(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                const ExpertPointers& experts, OperandPrecision precision, const MoeWorkspace& workspace, float* out,
                cudaStream_t stream, const ExpertDeltas* deltas = nullptr);
// The same for few tokens, bound by reading the routed experts' weights: one block per (routed expert, slice of
// output rows) streams each weight row once and dots it with the F32 activations of all the expert's tokens
// (no tensor cores, no rounding), then a combine in j order (one token with top_k <= 8: fused into the down pass,
// which then streams all the token's experts per output row). Supported when rows * top_k <=
// kMaxStreamingAssignments and H and I are multiples of 8 (16-byte loads; the arena aligns every weight).
// `activated` [rows * top_k, I] and `expert_out` [rows * top_k, H] are scratch (expert_out unused when fused).
// `row_invariant` (--batch-invariant): every row count takes the same kernels (the multi-token passes, the down pass
// unfused, then moe_combine), so a token's output does not depend on the other tokens of the call.
constexpr int32_t kMaxStreamingAssignments = 2048;
bool moe_streaming_supported(int64_t assignments, int64_t hidden, int64_t intermediate);
cudaError_t moe_streaming(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                          const ExpertPointers& experts, float* activated, float* expert_out, float* out,
                          cudaStream_t stream, bool row_invariant = false, const ExpertDeltas* deltas = nullptr);
// One token of BF16 experts with top_k <= 8 on the tensor cores, the weights staged through shared memory
// (moe_token.cu, quant/staged_moe.cuh): gate|up with the SwiGLU fused, then down with the combine fused (through
// scratch.partial and scratch.counters), the F32 activations as three BF16 terms, so the dots equal the streaming
// kernels' up to summation order. Supported for BF16 experts with H and I multiples of 8 whose shared memory fits,
// unless BEAMLINE_CUDA_TOKEN_MOE names a previous version (then moe_streaming). h and scratch.activated 16-byte
// aligned.
bool moe_token_staged_supported(const ExpertPointers& experts, int32_t top_k);
cudaError_t moe_token_staged(const float* h, const int32_t* ids, const float* weights, int32_t top_k,
                             const ExpertPointers& experts, const TokenMoeScratch& scratch, float* out,
                             cudaStream_t stream);
// out[t] = sum over j in order of expert_out[t * top_k + j] (the routing weights already applied); NaN for a token
// with an expert id outside [0, experts).
cudaError_t moe_combine(const float* expert_out, const int32_t* ids, int64_t rows, int32_t top_k, int32_t experts,
                        int64_t hidden, float* out, cudaStream_t stream);
// The same on the tensor cores for 2 tokens and more (moe/moe_mma.cu): per expert C^T = W · X^T, the weight
// rows as M streamed once per tile of the expert's tokens (N), X (h, then the SwiGLU output) converted once to BF16
// rows and read through the expert's slot list into the MMAs (`precision`: Split, hi, lo and lo2 rows and three
// mma.sync per product, the products FP32 arithmetic gives, tiles of 16 or 64 tokens; Bf16, one rounding and one wgmma per product when
// ExpertPointers::tensor_maps is set, tiles of 64 or 128 tokens), SwiGLU fused into gate|up, the routing weight into
// down, then moe_combine. One block groups the slots by expert first, so nothing waits for the host.
// Supported for BF16 experts, at most kMaxMmaExperts of them, H and I multiples of 8.
constexpr int32_t kMaxMmaExperts = 1024;
struct MoeMmaWorkspace {
  // BF16 operand row sets, operand_terms(precision) of them: hi (Bf16) or hi, lo, lo2 (Split).
  void* h = nullptr;             // [terms, rows, H]
  int32_t* grouped = nullptr;    // [rows * top_k] slots grouped by expert
  int32_t* tiles = nullptr;      // [max_tiles * 4] (expert, first grouped entry, slots, unused) per token tile
  void* activated = nullptr;     // [terms, rows * top_k, I]
  float* expert_out = nullptr;   // [rows * top_k, H]
  int64_t max_tiles = 0;         // at least moe_mma_max_tiles
};
bool moe_mma_supported(DType dtype, int32_t experts, int64_t hidden, int64_t intermediate);
// With OperandPrecision::Bf16 the GEMMs run on Hopper's warpgroup MMAs (wgmma), the weights streamed by TMA through
// one tensor map per expert matrix: this encodes the map of a BF16 weight [rows, cols] (cols a multiple of 8, the
// weight 16-byte aligned) into the kTensorMapBytes at host address `map`, to be uploaded 64-byte aligned.
constexpr size_t kTensorMapBytes = 128;
cudaError_t encode_expert_tensor_map(const void* weight, int64_t rows, int64_t cols, void* map);
int64_t moe_mma_max_tiles(int64_t assignments, int32_t experts);
// The bookkeeping of moe_mma on its own, for other expert GEMMs (quant/): groups the slots by expert into `grouped`
// and lists (expert, first grouped entry, slots, unused) per tile of up to tile_tokens (8, 16, 32, 64 or 128) slots in
// `tiles` [max_tiles, 4], expert -1 past the listed ones; max_tiles at least moe_tile_bound.
int64_t moe_tile_bound(int64_t assignments, int32_t experts, int32_t tile_tokens);
cudaError_t moe_group_slots(const int32_t* ids, int64_t assignments, int32_t experts, int32_t tile_tokens,
                            int64_t max_tiles, int32_t* grouped, int32_t* tiles, cudaStream_t stream);
cudaError_t moe_mma(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                    const ExpertPointers& experts, OperandPrecision precision, const MoeMmaWorkspace& workspace,
                    float* out, cudaStream_t stream, const ExpertDeltas* deltas = nullptr);

}  // namespace beamline::cuda
