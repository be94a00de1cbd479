#pragma once
// Launchers of the CUDA backend's kernels (internal to backend/cuda). They take raw device pointers and sizes
// that the backend has already validated, enqueue on `stream` and return the launch's error code, so each
// kernel can be replaced (the performance work) without touching the backend's checks or the model.
// Float buffers whose element type varies (weights, the KV pool) come as void* with their DType.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace beamline::cuda {

// How the compute-bound kernels feed F32 activations to the tensor cores (Backend::compute_dtype): Split = hi + lo
// BF16 operands (FP32-accurate products, two MMAs per product), Bf16 = one rounding to BF16 (one MMA). Kernels
// bound by memory read F32 as it is whatever this says.
enum class OperandPrecision { Split, Bf16 };

// ---- elementwise and per-row ----
// Token ids outside [0, vocab) give NaN rows (validated on the host beforehand).
cudaError_t embedding(const void* table, DType table_dtype, int64_t vocab, const int32_t* tokens, int64_t rows,
                      int64_t hidden, float* out, cudaStream_t stream);
cudaError_t rms_norm(const float* x, const void* weight, DType weight_dtype, float eps, int64_t rows, int64_t hidden,
                     float* out, cudaStream_t stream);
// residual += scale * rms(y, weight)
cudaError_t add_rms_norm(float* residual, const float* y, const void* weight, DType weight_dtype, float eps,
                         float scale, int64_t rows, int64_t hidden, cudaStream_t stream);
// out[i] = rms(x[rows[i]], weight) stored as `out_dtype` (BF16/F16/F32), the input of the LM head GEMM; a row
// outside the x_rows rows of x gives NaN.
cudaError_t gather_rms_norm(const float* x, int64_t x_rows, const int32_t* rows, int64_t selected, const void* weight,
                            DType weight_dtype, float eps, int64_t hidden, void* out, DType out_dtype,
                            cudaStream_t stream);
cudaError_t rope(float* x, const int32_t* positions, int64_t rows, int32_t num_heads, int32_t head_dim, float theta,
                 cudaStream_t stream);
cudaError_t ssmax_scale(float* q, const int32_t* positions, int64_t rows, int64_t width, float base, float exponent,
                        cudaStream_t stream);
// F32 activations as two tensor-core operands in `dtype` (BF16 or F16): hi = round(x), lo = round(x - hi), so
// x = hi + lo to about 16 significant bits. A GEMM over the rows [hi; lo] followed by add_halves multiplies F32
// activations by BF16 weights with an error near FP32's (about 2^-17 relative) where a single BF16 rounding of the
// activations gives 2^-9 — the difference between matching the CPU backend's argmax everywhere and at 97%.
// A null `lo` gives the single rounding of OperandPrecision::Bf16.
cudaError_t split_f32(const float* in, int64_t n, void* hi, void* lo, DType dtype, cudaStream_t stream);
// out[i] = halves[i] + halves[n + i]: the hi and lo products of split_f32's operands summed.
cudaError_t add_halves(const float* halves, int64_t n, float* out, cudaStream_t stream);
// gate[i] = silu(gate[i]) * up[i] in place: the dense MLP's activation between its GEMMs.
cudaError_t silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);
// x = cap * tanh(x / cap) in place.
cudaError_t soft_cap(float* x, int64_t n, float cap, cudaStream_t stream);
// normal_value(key, i, mean, stddev) (util/counter_random.h) stored as `dtype` (F32, F16, BF16): on-device random
// weights, the same bytes as the CPU backend's and make-model's.
cudaError_t fill_random(void* out, DType dtype, int64_t n, uint64_t key, float mean, float stddev, cudaStream_t stream);

// ---- projections for few rows ----
// y_s = x W_sᵀ for up to kMaxProjectionWeights weights W_s [out_s, in] (BF16 or F16, 16-byte aligned, all of one
// dtype) and one x [rows, in] F32 (16-byte aligned), y_s [rows, out_s] F32, in one launch that streams every
// weight once and dots it with the F32 rows on the CUDA cores: exact products, FP32 sums, whatever the
// OperandPrecision (decode is bound by the weight bytes, not by arithmetic). softcap > 0 stores
// softcap * tanh(y / softcap) instead. Supported for 1..kMaxProjectionRows rows and `in` a multiple of 8.
constexpr int32_t kMaxProjectionWeights = 4;
constexpr int64_t kMaxProjectionRows = 2;
struct ProjectionBatch {
  const void* weight[kMaxProjectionWeights] = {};
  float* y[kMaxProjectionWeights] = {};
  int64_t out[kMaxProjectionWeights] = {};
  int32_t count = 0;
  DType dtype = DType::BF16;
  int64_t in = 0;
  float softcap = 0.0f;
};
bool projection_supported(DType dtype, int64_t rows, int64_t in);
cudaError_t project_rows(const float* x, int64_t rows, const ProjectionBatch& batch, cudaStream_t stream);

// ---- paged KV ----
struct PoolGeometry {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;  // F32 or BF16
  int32_t num_blocks = 0, slots_per_block = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
};

struct BatchGeometry {
  const int32_t* positions = nullptr;     // [rows]
  const int32_t* row_sequence = nullptr;  // [rows]
  const int32_t* seq_lens = nullptr;      // [sequences]
  const int32_t* block_table = nullptr;   // [sequences, table_width]
  int64_t rows = 0;
  int32_t table_width = 0;
};

// Rows whose block is missing or out of the pool are skipped by write_kv and make paged_attention write NaN
// for that row and head (the CPU backend throws there; a device cannot without a host synchronisation).
cudaError_t write_kv(const float* k, const float* v, const PoolGeometry& pool, int32_t slot,
                     const BatchGeometry& batch, cudaStream_t stream);

// Host-side facts of a batch (AttentionBatch's host copies) from which paged_attention's kernels are chosen.
struct AttentionHostBatch {
  const int32_t* query_start = nullptr;  // [sequences + 1]
  const int32_t* positions = nullptr;    // [rows]
  const int32_t* seq_lens = nullptr;     // [sequences]
  int32_t sequences = 0;
  int64_t rows = 0;
};

// Sequences with at most this many query rows (decode, short speculative chunks) take the split-KV decode
// kernel; longer ones the tiled prefill kernel (on the tensor cores for BF16 pools: q and P as `precision`
// operands, K and V exact).
constexpr int32_t kDecodeMaxQueryRows = 4;

// The kernels paged_attention runs for one batch, chosen on the host from AttentionHostBatch (no device read).
struct AttentionPlan {
  bool generic = false;  // head_dim != 128, > 8 query heads per kv head, block size not a power of two or
                         // unaligned q/out: the one-block-per-(row, kv head) kernel
  int64_t decode_rows = 0;     // rows of the split-KV decode kernel
  bool decode_rows_listed = false;  // they are work[0, decode_rows) (else rows 0 .. decode_rows - 1)
  int32_t splits = 1;          // key ranges per (decode row, kv head)
  int64_t prefill_tiles = 0;   // (sequence, first row, rows) triples in work after the decode rows
  std::vector<int32_t> work;   // for the caller to upload (empty when nothing needs listing)
  int64_t scratch_floats = 0;  // F32 scratch for the split-KV partial results
  OperandPrecision precision = OperandPrecision::Split;  // of the tensor-core prefill kernel (BF16 pools)
};
AttentionPlan plan_attention(const AttentionHostBatch& batch, const PoolGeometry& pool, int32_t num_heads,
                             int32_t sliding_window, bool aligned, OperandPrecision precision);
// `work` is plan.work on the device, `scratch` plan.scratch_floats floats.
cudaError_t paged_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                            const AttentionPlan& plan, const int32_t* work, float* scratch, int32_t num_heads,
                            float scale, int32_t sliding_window, float* out, cudaStream_t stream);
constexpr int32_t kMaxAttentionHeadDim = 256;
constexpr int32_t kMaxAttentionGroup = 32;  // query heads per kv head

// ---- router and experts ----
// Group-limited top-k over router logits [rows, experts] (computed by a GEMM beforehand).
cudaError_t route_topk(const float* logits, const float* bias, int64_t rows, int32_t experts, int32_t n_group,
                       int32_t topk_group, int32_t top_k, bool norm_topk_prob, float routed_scaling_factor,
                       int32_t* expert_ids, float* expert_weights, cudaStream_t stream);
constexpr int32_t kMaxRouterExperts = 1024;

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
};

// Scratch of one MoE call, sized by moe_workspace_bytes for (rows * top_k) assignments.
struct MoeWorkspace {
  int32_t* counts = nullptr;       // [E]
  int32_t* cursor = nullptr;       // [E]
  int32_t* offsets = nullptr;      // [E] first padded row of each expert
  int32_t* tile_expert = nullptr;  // [max_tiles] expert of each row tile, -1 past the last
  int32_t* slot_row = nullptr;     // [rows * top_k] padded row of each (token, j)
  int32_t* row_token = nullptr;    // [max_tiles * tile] token feeding each padded row, -1 for padding
  float* activated = nullptr;      // [max_tiles * tile, I]
  float* expert_out = nullptr;     // [max_tiles * tile, H]
  int64_t max_tiles = 0;
};
int64_t moe_max_tiles(int64_t assignments, int32_t experts);

// out[t] = sum_j weights[t, j] * SwiGLU_{ids[t, j]}(h[t]) with no host synchronisation: count, pad and
// map the rows per expert, two grouped GEMMs reading h through the map (gate|up with the SwiGLU fused, then down;
// F32 activations split hi + lo onto the tensor cores), combine in j order. Expert ids outside [0, E) make the
// token's output NaN.
cudaError_t moe(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                const ExpertPointers& experts, const MoeWorkspace& workspace, float* out, cudaStream_t stream);
// The same for few tokens, bound by reading the routed experts' weights: one block per (routed expert, slice of
// output rows) streams each weight row once and dots it with the F32 activations of all the expert's tokens
// (no tensor cores, no rounding), then a combine in j order (one token with top_k <= 8: fused into the down pass,
// which then streams all the token's experts per output row). Supported when rows * top_k <=
// kMaxStreamingAssignments and H and I are multiples of 8 (16-byte loads; the arena aligns every weight).
// `activated` [rows * top_k, I] and `expert_out` [rows * top_k, H] are scratch (expert_out unused when fused).
constexpr int32_t kMaxStreamingAssignments = 2048;
bool moe_streaming_supported(int64_t assignments, int64_t hidden, int64_t intermediate);
cudaError_t moe_streaming(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                          const ExpertPointers& experts, float* activated, float* expert_out, float* out,
                          cudaStream_t stream);
// out[t] = sum over j in order of expert_out[t * top_k + j] (the routing weights already applied); NaN for a token
// with an expert id outside [0, experts).
cudaError_t moe_combine(const float* expert_out, const int32_t* ids, int64_t rows, int32_t top_k, int32_t experts,
                        int64_t hidden, float* out, cudaStream_t stream);
// The same on the tensor cores for 2 tokens and more (kernels_moe_mma.cu): per expert C^T = W · X^T, the weight
// rows as M streamed once per tile of up to 16 or 64 of the expert's tokens (N), X (h, then the SwiGLU output)
// converted once to BF16 rows and read through the expert's slot list into the MMAs (`precision`: Split, hi + lo
// rows and two MMAs, FP32-accurate products; Bf16, one rounding and one MMA), SwiGLU fused into gate|up, the routing
// weight into down, then moe_combine. One block groups the slots by expert first, so nothing waits for the host.
// Supported for BF16 experts, at most kMaxMmaExperts of them, H and I multiples of 8.
constexpr int32_t kMaxMmaExperts = 1024;
struct MoeMmaWorkspace {
  void* h_hi = nullptr;          // [rows, H] BF16
  void* h_lo = nullptr;          // [rows, H] BF16 (Split only)
  int32_t* grouped = nullptr;    // [rows * top_k] slots grouped by expert
  int32_t* tiles = nullptr;      // [max_tiles * 4] (expert, first grouped entry, slots, unused) per token tile
  void* activated_hi = nullptr;  // [rows * top_k, I] BF16
  void* activated_lo = nullptr;  // [rows * top_k, I] BF16 (Split only)
  float* expert_out = nullptr;   // [rows * top_k, H]
  int64_t max_tiles = 0;         // at least moe_mma_max_tiles
};
bool moe_mma_supported(DType dtype, int32_t experts, int64_t hidden, int64_t intermediate);
int64_t moe_mma_max_tiles(int64_t assignments, int32_t experts);
cudaError_t moe_mma(const float* h, const int32_t* ids, const float* weights, int64_t rows, int32_t top_k,
                    const ExpertPointers& experts, OperandPrecision precision, const MoeMmaWorkspace& workspace,
                    float* out, cudaStream_t stream);

// ---- sampling ----
// One row of Backend::sample as the kernel reads it (uploaded per call).
struct SampleRowParams {
  double uniform = 0.0;
  int32_t logit_row = 0, greedy = 0, top_k = 0, num_logprobs = -1;
  float temperature = 1.0f, min_p = 0.0f, top_p = 1.0f, unused = 0.0f;
};
// Backend::sample over `count` rows of logits [*, vocab], vocab at most 1398016: one block per row, a second kernel for
// the logprobs (kernels_sampling.cu). The logprob outputs may be null when no row has num_logprobs >= 0; top_* are
// [count, top_width].
cudaError_t sample(const float* logits, int64_t vocab, const SampleRowParams* rows, int32_t count, int32_t* tokens,
                   float* logprobs, int32_t* ranks, int32_t* top_ids, float* top_logprobs, int32_t top_width,
                   cudaStream_t stream);

}  // namespace beamline::cuda
