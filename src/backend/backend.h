#pragma once
// The op set of the Beam forward pass (docs/model-format.md §4). The model is written once against this
// interface; the CPU backend (backend/cpu) is the reference and every other backend (CUDA) implements the
// same ops with the same contracts, so a test can run one op on two backends over the same inputs and
// compare (llama.cpp test-backend-ops discipline).
//
// Conventions for every op:
//  - Tensors come from the same backend (alloc/upload/load_weight). Activations are F32, row-major:
//    [T, features] with T the rows of the flattened (varlen) batch. Index tensors are I32.
//  - Weights are used in their stored dtype (BF16, F16 or F32) and every sum accumulates in FP32.
//  - Outputs are preallocated by the caller with the documented shape; ops check shapes and throw
//    beamline::Error on a mismatch. Ops may run asynchronously on a device; download() synchronizes.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tensor.h"
#include "sampling/sampling.h"
#include "tensor/tensor_view.h"

namespace beamline {

// The most ranks Backend::all_reduce_add_rms_norm sums (a tensor-parallel group of one node: 8 GPUs).
constexpr int32_t kMaxAllReduceRanks = 8;

// A projection y = x Wᵀ with W [out, in] as stored. Quantized weights (docs/model-format.md §5) also carry
// `scale` (block/group scales) and `scale_2` (NVFP4 per-tensor scale); undefined where a scheme has none.
struct LinearTensors {
  Tensor weight, scale, scale_2;
  int64_t out_features() const { return weight.dim(0); }
};

// down(silu(gate(h)) * up(h)): gate/up [I, H], down [H, I].
struct SwigluTensors {
  LinearTensors gate, up, down;
};

// The routed experts of one MoE layer. `packed` is backend-private state made once by Backend::prepare_moe
// (stacked or re-laid-out experts for grouped GEMMs); the CPU backend uses `experts` as they are.
struct MoeTensors {
  Tensor router;       // [E, H] F32
  Tensor router_bias;  // [E] F32 (e_score_correction_bias)
  std::vector<SwigluTensors> experts;
  std::shared_ptr<void> packed;
};

// LoRA adapters of one projection (docs/lora.md), stacked: adapter i is y += b[i] (a[i] x), a [N, R, in] and
// b [N, out, R] F32, R the largest rank served (--max-lora-rank; a smaller adapter's extra rows of a and columns of b
// are zero) and its scale (lora_alpha / r) already multiplied into b. Undefined when no loaded adapter targets the
// projection.
struct LoraTensors {
  Tensor a, b;
  bool defined() const { return a.defined(); }
};

// LoRA adapters of one projection [in -> out], each at its own rank (MoE LoRA at true rank, docs/lora.md): entry i of
// `entries` I64 [N, 3] is {address of a_i, address of b_i, r_i}, a_i [r_i, in] and b_i [out, r_i] F32 in this
// backend's memory (device addresses on a device), the scale already in b_i; r_i = 0: no adapter (addresses unused).
// max_rank bounds every r_i. The tensors behind the addresses belong to whoever made the table (model/lora_table.h).
struct LoraTable {
  Tensor entries;
  int64_t in = 0, out = 0, max_rank = 0;
  bool defined() const { return entries.defined(); }
};

// LoRA on the three projections of a SwiGLU MLP: of each routed expert (MoE LoRA) or of a dense MLP (one expert).
// Token t's rows through expert e use entry row_adapters[t] * experts + e of each defined projection's table, where
// row_adapters I32 [T] holds the adapter slot of each token (-1: none) and `experts` is MoeTensors::experts.size().
struct SwigluLora {
  LoraTable gate, up, down;
  Tensor row_adapters;
};

struct RouterParams {
  int32_t n_group = 1;
  int32_t topk_group = 1;
  int32_t top_k = 1;  // num_experts_per_tok
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// The paged KV pool: K and V each [num_blocks, slots_per_block, block_size, num_kv_heads, head_dim], F32, BF16 or
// F8_E4M3 (--kv-cache-dtype fp8). Layer slot `slot` of block `b` holds positions [i*block_size, (i+1)*block_size) of a
// sequence whose block table has b at index i.
// `scales`: F32 [2], the (k_scale, v_scale) of the layer being written or read, vLLM's per-tensor KV scales: an
// E4M3 pool stores e4m3(k / k_scale) and reads code * k_scale (v likewise). A view of one row of the model's
// F32 [layers, 2] scales (BeamModel::kv_scales), read on the device at every op, so that recorded graphs see scales
// set later. Undefined: 1.0. F32 and BF16 pools ignore it.
struct PagedKvPool {
  Tensor k, v;
  Tensor scales;
  int32_t num_blocks() const { return static_cast<int32_t>(k.dim(0)); }
  int32_t slots_per_block() const { return static_cast<int32_t>(k.dim(1)); }
  int32_t block_size() const { return static_cast<int32_t>(k.dim(2)); }
  int32_t num_kv_heads() const { return static_cast<int32_t>(k.dim(3)); }
  int32_t head_dim() const { return static_cast<int32_t>(k.dim(4)); }
};

// Where each row of a varlen batch sits, uploaded once per forward step and shared by all layers.
// Sequence s owns rows [query_start[s], query_start[s+1]); row r is at absolute position positions[r] of its
// sequence; after this step's KV writes, sequence s has seq_lens[s] positions [0, seq_lens[s]) in the cache.
// Block tables (one per KV group) are I32 [num_sequences, max_blocks]; an entry < 0 is a block that was
// given back (kNullBlock) and must not be needed by any query of the step.
struct AttentionBatch {
  Tensor positions;     // I32 [T]
  Tensor row_sequence;  // I32 [T]: the sequence of each row
  Tensor query_start;   // I32 [S + 1]
  Tensor seq_lens;      // I32 [S]
  // Host copies of the same, for backends and launch heuristics that need them without a device read.
  std::vector<int32_t> host_positions, host_row_sequence, host_query_start, host_seq_lens;
  int32_t max_query_len = 0, max_seq_len = 0;
  int32_t num_rows() const { return static_cast<int32_t>(host_positions.size()); }
  int32_t num_sequences() const { return static_cast<int32_t>(host_seq_lens.size()); }
};

struct AttentionParams {
  int32_t num_heads = 0;       // query heads; head h reads kv head h / (num_heads / num_kv_heads)
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  float scale = 1.0f;          // applied to q·k (1/sqrt(head_dim))
  int32_t sliding_window = 0;  // > 0: key t visible to query p iff t <= p && p - t < window; 0: t <= p
  int32_t slot = 0;            // layer slot inside each block
};

// The outputs of Backend::sample for N rows. `tokens` is always needed; the logprob tensors only when some row
// has num_logprobs >= 0 (then all four, with K >= the largest num_logprobs).
struct SampleOutputs {
  Tensor tokens;        // I32 [N]: the chosen token of each row
  Tensor logprobs;      // F32 [N]: log_softmax(raw row)[token]
  Tensor ranks;         // I32 [N]: 1 + the number of tokens with a higher raw logit
  Tensor top_ids;       // I32 [N, K]: the row's num_logprobs most likely tokens, best first (ties: lower id)
  Tensor top_logprobs;  // F32 [N, K]: their log_softmax
};

// How F32 activations meet BF16/F16 weights on matrix units (`--dtype`, vLLM's flag and meaning for the compute
// precision). Float32: the products FP32 arithmetic gives (a device backend splits each activation into three BF16
// operands, hi + lo + lo2, which sum to it exactly: three times the tensor-core work). BFloat16: activations rounded
// to BF16 once where they enter a matrix unit (what vLLM computes; a third of the work). Activations stay F32
// between ops either way, and the CPU backend always computes in FP32.
enum class ComputeDType { Float32, BFloat16 };

// A recorded sequence of ops (a CUDA graph) that Backend::replay runs again on the buffers it was recorded with.
// What its ops read is refreshed in place between replays (Backend::copy_to). The tensors allocated while it was
// recorded come from one pool that every graph shares: what a replay writes (its logits) must be used, in stream
// order, before the next step runs.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
};

// A device-to-host copy queued behind the ops enqueued before it (Backend::download_later). The bytes are in the host
// buffer once wait() returns; destroying the handle waits too, so the buffer is never written later.
class PendingDownload {
 public:
  virtual ~PendingDownload() = default;
  virtual void wait() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // ---- memory ----
  virtual Tensor alloc(DType dtype, std::vector<int64_t> shape) = 0;  // uninitialised
  virtual void fill_zero(Tensor& tensor) = 0;
  virtual Tensor upload(const void* host, DType dtype, std::vector<int64_t> shape) = 0;
  virtual void download(const Tensor& tensor, void* host) = 0;  // waits for pending work
  // download() without the wait: the host may enqueue more work before it needs the bytes (the engine's next step,
  // with --async-scheduling). `host` must stay valid until the handle's wait() returns. Default: download at once.
  virtual std::unique_ptr<PendingDownload> download_later(const Tensor& tensor, void* host);
  // Overwrites `tensor` with tensor.nbytes() host bytes, in order with the ops enqueued so far.
  virtual void copy_to(Tensor& tensor, const void* host) = 0;
  virtual void synchronize() {}
  // The device's total memory and the part in use (by this process and any other), for
  // --gpu-memory-utilization; nullopt where the backend has no device memory of its own (the CPU).
  struct MemoryInfo {
    int64_t total_bytes = 0, used_bytes = 0;
  };
  virtual std::optional<MemoryInfo> memory_info() { return std::nullopt; }
  // Before the first op. Default: FP32 everywhere (the CPU backend), whatever is asked.
  virtual void set_compute_dtype(ComputeDType dtype) { (void)dtype; }
  virtual ComputeDType compute_dtype() const { return ComputeDType::Float32; }
  // Batch-invariant mode (--batch-invariant, vLLM's VLLM_BATCH_INVARIANT): every op computes each row the same way,
  // bit for bit, whatever else its call holds (how many rows, prefill or decode rows, where the row sits), so that a
  // request's results do not depend on what shares its steps. Before the first op. Returns false, changing nothing,
  // where the backend cannot. Default: off only.
  virtual bool set_batch_invariant(bool on) { return !on; }

  // ---- op graphs, for steps whose shapes repeat (decode) ----
  // Between begin_capture and end_capture, ops are recorded into a graph instead of running; replay runs it.
  // Only what an op decides on the host from its arguments' shapes, and from what attention_signature covers, may
  // differ between the recording and a replay. Backends without graphs say so with supports_graphs() == false.
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture();
  virtual std::unique_ptr<OpGraph> end_capture();
  virtual void replay(const OpGraph& graph);
  // The host-side choices paged_attention makes for `batch` (kernels, splits): batches with equal signatures may
  // share a recorded graph. nullopt where those choices need a per-step upload that a graph cannot hold.
  virtual std::optional<std::string> attention_signature(const AttentionBatch& batch, const PagedKvPool& pool,
                                                         const AttentionParams& params) const {
    (void)batch, (void)pool, (void)params;
    return std::string();
  }

  // ---- weights, once at model load ----
  // A weight as the ops read it. The CPU backend borrows the mmap'd bytes (no copy; the view's owner must
  // outlive the tensor); a device backend copies it to device memory.
  virtual Tensor load_weight(const TensorView& view) = 0;
  // A weight drawn by the backend itself, with no checkpoint (and, on a device, no host copy): element i is
  // normal_value(key, i, mean, stddev) (util/counter_random.h) stored as `dtype` (F32, BF16, F16), so every backend
  // and make-model's checkpoints hold the same bytes for the same key (--load-format dummy).
  virtual Tensor random_weight(DType dtype, std::vector<int64_t> shape, uint64_t key, float mean, float stddev) = 0;
  // Before a model's weights arrive: the byte size of each, so a device backend can take them in one allocation.
  // Default: nothing.
  virtual void reserve_weights(std::span<const std::size_t> tensor_bytes) { (void)tensor_bytes; }
  // A chance to repack one MoE layer's experts (fill MoeTensors::packed). Default: nothing.
  virtual void prepare_moe(MoeTensors& moe) { (void)moe; }

  // ---- ops ----
  // out[t] = table[tokens[t]] as F32. table [V, H] (any float dtype), tokens I32 [T], out [T, H]. An id outside [0, V)
  // is an Error where the ids are on the host (cpu); a device backend, whose ids live on the device, writes NaN over
  // that row instead, so that the bad id cannot pass unnoticed.
  virtual void embedding(const Tensor& table, const Tensor& tokens, Tensor& out) = 0;
  // tokens[pairs[2j]] = source[pairs[2j + 1]] for each (row, source row) pair of the host list `pairs`: the ids of
  // tokens that an earlier step sampled on the device and the host has not read yet (--async-scheduling).
  // source I32 [N], tokens I32 [T]; a pair out of range is an Error.
  virtual void place_tokens(const Tensor& source, std::span<const int32_t> pairs, Tensor& tokens) = 0;
  // out = rms(x, weight) = x / sqrt(mean(x²) + eps) * weight, per row. x, out [T, H]; weight [H].
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // residual += scale * rms(y, weight), per row (the sandwich-norm residual add). residual, y [T, H].
  virtual void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale) = 0;
  // add_rms_norm(residual, y, weight, eps, scale) then out = rms(residual, next_weight): a sandwich norm's residual
  // add and the next sub-layer's input norm, one op so that a device backend can do both in one pass over the row.
  // Default: the two ops.
  virtual void add_rms_norm_then_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale,
                                      const Tensor& next_weight, Tensor& out);
  // add_rms_norm_then_norm(residual, y, weight, eps, scale, next_weight, out) then route(out, router, bias, params,
  // expert_ids, expert_weights): the sandwich norm after attention, the MoE's input norm and its router as one op, so
  // that a device backend can fold the one-row norms into the router's blocks at decode. Default: the two ops.
  virtual void add_rms_norm_then_route(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale,
                                       const Tensor& next_weight, Tensor& out, const Tensor& router, const Tensor& bias,
                                       const RouterParams& params, Tensor& expert_ids, Tensor& expert_weights);
  // The tensor-parallel all-reduce fused into the sandwich norm (issue 19): y = partials[0] + partials[1] + ... summed
  // left to right in rank order, so that every rank of the group computes the same bits, then add_rms_norm(residual,
  // y, weight, eps, scale); with next_weight defined, also out = rms(residual, next_weight) (add_rms_norm_then_norm;
  // both undefined: no next norm). partials: one F32 [T, H] per rank, at most kMaxAllReduceRanks (on a TP run this
  // rank's buffer and its peers', mapped over NVLink; in backend_ops, buffers of one device standing for the ranks).
  // Only the local math: the cross-GPU handshake is the CUDA launcher's (cuda/rows/all_reduce_norm.h).
  virtual void all_reduce_add_rms_norm(std::span<const Tensor> partials, Tensor& residual, const Tensor& weight,
                                       float eps, float scale, const Tensor& next_weight, Tensor& out) = 0;
  // y = x Wᵀ. x [T, in] F32, weight [out, in], y [T, out] F32.
  virtual void linear(const Tensor& x, const LinearTensors& weight, Tensor& y) = 0;
  // ys[i] = x weights[i]ᵀ for weights of one input width (q, k and v of a layer): one op, so that a device backend
  // can stream all of them in one pass. Default: linear once per weight.
  virtual void linear_many(const Tensor& x, std::span<const LinearTensors* const> weights, std::span<Tensor* const> ys);
  // In place, NeoX rotate-half over the full head_dim: for each head, pairs (j, j + D/2) rotate by
  // angle positions[t] * theta^(-2j/D). x [T, num_heads * head_dim].
  virtual void rope(Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim, float theta) = 0;
  // rope(q, positions, num_heads, ...) and rope(k, positions, num_kv_heads, ...), one op (vLLM's rotary embedding
  // takes query and key together) so that a device backend can rotate both in one launch. Default: the two ops.
  virtual void rope_qk(Tensor& q, Tensor& k, const Tensor& positions, int32_t num_heads, int32_t num_kv_heads,
                       int32_t head_dim, float theta);
  // In place, SSMax: q[t] *= (1 + positions[t] / base) ^ exponent. q [T, any].
  virtual void ssmax_scale(Tensor& q, const Tensor& positions, float base, float exponent) = 0;
  // Stores row r's k and v ([T, num_kv_heads * head_dim]) at position positions[r] of its sequence, in layer
  // slot `slot` of the pool, through `block_table` (converting to the pool's dtype; an E4M3 pool stores
  // k / k_scale and v / v_scale of pool.scales, rounded to nearest even and saturated at ±448).
  virtual void write_kv(const Tensor& k, const Tensor& v, PagedKvPool& pool, int32_t slot, const Tensor& block_table,
                        const AttentionBatch& batch) = 0;
  // out[0] = max_i |x[i]| / divisor: a per-tensor scale from x's magnitude (vLLM's --calculate-kv-scales:
  // k_scale = max|k| / 200, v_scale = max|v| / 100), written on the device without a host round trip. NaN elements
  // are skipped; when the maximum is 0 or infinite, out[0] = 1.0 (a scale of 0 or infinity would make every code
  // NaN). x F32, any shape; out F32 with one element (a view into a larger tensor: one entry of the KV scales);
  // divisor > 0.
  virtual void amax_scale(const Tensor& x, float divisor, Tensor& out) = 0;
  // out[r, h] = softmax_t(scale * q[r, h] · K[t]) V[t] over the cached keys t of row r's sequence visible to
  // position positions[r] (causal, windowed when params.sliding_window > 0), GQA. One op for prefill,
  // chunked prefill and decode. q, out [T, num_heads * head_dim]. An E4M3 pool's K[t] and V[t] are its codes times
  // pool.scales' k_scale and v_scale.
  virtual void paged_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                               const AttentionBatch& batch, const AttentionParams& params, Tensor& out) = 0;
  // The block drafter's attention (docs/model-format.md §6), all of a draft layer's block rows in one op. `blocks`
  // describes S blocks as S sequences of one row each, at the block's last position (positions[s] = seq_lens[s] - 1;
  // the block's B keys are positions seq_lens[s] - B .. seq_lens[s] - 1, already written). q and out are
  // [B * S, num_heads * head_dim] block-row-major: row i * S + s is row i of block s, at position
  // p = seq_lens[s] - B + i, and it sees key t iff t < seq_lens[s] and (sliding_window == 0 or p - t < window): the
  // context within its window and every key of the block (bidirectional). Otherwise paged_attention's contract.
  virtual void block_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                               const AttentionBatch& blocks, const AttentionParams& params, Tensor& out) = 0;
  // FP32 noaux_tc router (docs/model-format.md §4): score = sigmoid(h Wrᵀ); choose with score + bias, limited
  // to the topk_group best groups (group score = sum of its 2 best choices); weigh with score (renormalised if
  // norm_topk_prob) * routed_scaling_factor. Ties go to the lower index. h [T, H]; router [E, H] F32;
  // bias [E] F32; expert_ids I32 [T, top_k] and expert_weights F32 [T, top_k], in order of selection.
  virtual void route(const Tensor& h, const Tensor& router, const Tensor& bias, const RouterParams& params,
                     Tensor& expert_ids, Tensor& expert_weights) = 0;
  // out[t] = sum_j expert_weights[t, j] * SwiGLU_{expert_ids[t, j]}(h[t]), summed in j order. h, out [T, H].
  virtual void moe(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
                   Tensor& out) = 0;
  // moe() with LoRA on the experts' projections (SwigluLora): inside each expert, gate(h), up(h) and down(a) each add
  // b (a x) of the row's adapter entry (its rank-r_i intermediate summed in FP32 first), before the SwiGLU and before
  // the routing weight multiplies the expert's output. Default: an Error naming the backend.
  virtual void moe_lora(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
                        const SwigluLora& lora, Tensor& out);
  // Gathered LoRA (punica's BGMV): y[t] += lora.b[i] (lora.a[i] x[t]) with i = indices[t], for every row whose
  // index is >= 0 (rows with -1 are left as they are). x [T, in] F32, indices I32 [T] in [-1, N), y [T, out] F32;
  // the rank-R intermediate is summed in FP32 before b is applied.
  virtual void lora(const Tensor& x, const LoraTensors& lora, const Tensor& indices, Tensor& y) = 0;
  // out = down(silu(gate(h)) * up(h)). h, out [T, H].
  virtual void swiglu(const Tensor& h, const SwigluTensors& mlp, Tensor& out) = 0;
  // logits[i] = softcap * tanh((rms(x[rows[i]], norm) headᵀ) / softcap) (no cap when softcap <= 0).
  // x [T, H]; rows I32 [R]; norm [H]; head [V, H]; logits [R, V] F32.
  virtual void lm_head(const Tensor& x, const Tensor& rows, const Tensor& norm, float eps, const LinearTensors& head,
                       float softcap, Tensor& logits) = 0;
  // Chooses one token per entry of `rows` (host data, N entries) from logits [R, V] F32 (sampling/sampling.h's
  // sample_row is the definition): greedy argmax with ties to the lower id, or temperature -> min_p -> top_k
  // (ties with the k-th kept) -> top_p (smallest most-likely set, ties by lower id) -> the inverse-CDF draw of
  // rows[i].uniform over the kept tokens in token-id order. NaN logits count as -inf; a row with no finite
  // logit gives token 0. Logprobs (rows with num_logprobs >= 0) are of the RAW row (vLLM's default). Logit
  // bias, penalties and min_tokens masking are not applied here: the engine samples such rows on the host
  // (engine/sampler.h). Outputs of rows that ask for fewer logprobs than K, or none, are left as they are.
  virtual void sample(const Tensor& logits, std::span<const SampleRow> rows, SampleOutputs& out) = 0;
  // Structured outputs' token masks, applied before sample: for each i, logits[rows[i], t] = -inf for every token t
  // whose bit (bit t % 32 of word t / 32) is clear in allowed[i]. allowed I32 [N, W] with 32 W >= V (bits past V are
  // ignored); rows is host data, N entries, each in [0, R); logits [R, V] F32, edited in place.
  virtual void mask_logits(Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed) = 0;

  // ---- conveniences over the virtual memory functions ----
  Tensor upload_f32(std::span<const float> host, std::vector<int64_t> shape);
  Tensor upload_i32(std::span<const int32_t> host, std::vector<int64_t> shape);
  std::vector<float> download_f32(const Tensor& tensor);  // F32 tensors only
  std::vector<int32_t> download_i32(const Tensor& tensor);  // I32 tensors only
  // The host-side batch description uploaded as an AttentionBatch. query_start has S+1 entries.
  AttentionBatch make_attention_batch(std::vector<int32_t> positions, std::vector<int32_t> query_start,
                                      std::vector<int32_t> seq_lens);
  // Its host half, checked, with the device tensors left for the caller to set (BeamModel packs them into one
  // upload).
  static AttentionBatch describe_attention_batch(std::vector<int32_t> positions, std::vector<int32_t> query_start,
                                                 std::vector<int32_t> seq_lens);
};

// vLLM's --dtype and --kv-cache-dtype for a backend on `device`. --dtype: auto (BF16 operands on a device with
// matrix units, FP32 on the CPU), bfloat16, float32. --kv-cache-dtype: auto (the compute dtype, as vLLM's auto follows
// the model dtype: F32 with --dtype float32 and on the CPU, BF16 with bfloat16), bfloat16, float32 (bf16 / f32 too).
// Anything else is an Error naming the flag and the accepted values.
ComputeDType parse_compute_dtype(std::string_view name, Device device);
DType parse_kv_cache_dtype(std::string_view name, ComputeDType compute);

// Checks used by every backend's ops: a clear Error naming the op and argument when a shape or dtype is wrong.
void require_shape(const Tensor& tensor, const std::vector<int64_t>& shape, std::string_view op, std::string_view what);
void require_dtype(const Tensor& tensor, DType dtype, std::string_view op, std::string_view what);

}  // namespace beamline
