#pragma once
// The Beam forward pass (docs/model-format.md §4), written once against the Backend op set.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/lora_table.h"
#include "model/lora_weights.h"
#include "model/model_shard.h"
#include "model/weights.h"
#include "kv/kv_cache_layout.h"
#include "parallel/parallel_groups.h"

namespace beamline {

// The router settings of a config's MoE layers, as the backend's route op takes them.
RouterParams router_params(const ModelConfig& config);

// The paged KV cache a step reads and writes: the pool and how the layers map onto it. runner/kv_cache.h's KvCache
// owns both and converts to this view, so the model does not depend on who allocates the pool.
struct KvCacheView {
  const KvCacheLayout& layout;
  PagedKvPool& pool;
};

class BeamModel {
 public:
  // Hands every weight to the backend once (load_weight / prepare_moe). Keeps a copy of `weights` (and so its
  // mappings) alive; `backend` must outlive the model.
  BeamModel(const BeamWeights& weights, Backend& backend);
  // One rank of a distributed model (docs/parallel.md): `weights` are this rank's shard (checkpoint/shard_weights.h)
  // and `groups` (which must outlive the model) its communicators. forward() is then collective over the groups: every
  // rank runs the same batches in the same order (the data-parallel ranks their own batches, step for step). Its
  // logits come back on the first pipeline stage (and the last); other stages get an undefined tensor.
  BeamModel(const BeamWeights& weights, Backend& backend, const ModelShard& shard, ParallelGroups* groups);

  // The config as this rank computes it: num_attention_heads and num_key_value_heads are its own heads (what its KV
  // cache holds); everything else is the model's.
  const ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return shard_; }
  // The checkpoint names of the tensors this rank loaded (its shard's; every one on one process).
  std::set<std::string, std::less<>> loaded_tensor_names() const;
  Backend& backend() const { return backend_; }

  // One step over a varlen batch: writes the K/V of every new token into `cache` (through the batch's block
  // tables), attends over the cache, and returns the soft-capped logits of batch.logit_rows as an F32 tensor
  // [logit_rows.size(), vocab_size] on the backend. Validates the batch (token ids, row ranges, block table
  // coverage) and throws beamline::Error naming the field. `token_source` (I32 [N] on this backend) holds the
  // previous step's sampled tokens that batch.deferred_tokens read; a batch without them needs none.
  // `routed_experts` (routing replay, --enable-return-routed-experts), when defined: I32 [num_moe_layers(), rows,
  // top_k] on this backend, rows the step's token rows; the router writes each MoE layer's expert ids (its top-k, in
  // order of selection) straight into that layer's slice, so capturing them costs no extra device work. Distributed:
  // the router is replicated, so any rank of a stage sees its layers' routing of every row; the runner captures on
  // tensor-parallel rank 0 of each stage (only), and the later stages send theirs to the first, whose tensor then
  // holds every MoE layer (under expert parallelism the ids are copied out before they are renumbered, on the host
  // path that renumbering already takes).
  Tensor forward(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source = {},
                 const Tensor& routed_experts = {});
  // forward() of a batch that validate() has passed.
  Tensor forward_validated(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source,
                           const Tensor& routed_experts = {});
  // A data-parallel replica with no batch this step, under expert parallelism: joins the other replicas' expert
  // collectives with no rows of its own (every MoE layer of its stage), as vLLM's dummy batches keep the
  // all-gather / reduce-scatter of every data-parallel rank in step. Writes no KV.
  void dummy_forward();
  // Pipeline micro-batches (--pipeline-parallel-size above 1, ParallelConfig::pipeline_micro_batches): where forward()
  // splits the batch's sequences into micro-batches of about equal rows, at least kMinMicroBatchRows each, each with a
  // logit row: {0, ..., sequences}; {0, sequences} for one.
  static constexpr int64_t kMinMicroBatchRows = 128;
  std::vector<std::size_t> micro_batch_bounds(const ForwardBatch& batch) const;

  // The same in three parts, for recorded steps (runner/decode_graphs.h): what a step reads besides weights and
  // cache, all I32, packed on the host so that it reaches the device in one copy and, for a graph, into the same
  // buffer every step.
  struct StepInputs {
    // tokens | positions | row_sequence | query_start | seq_lens | tables | logit rows (| capture rows)
    std::vector<int32_t> packed;
    AttentionBatch attention;     // host copies; its tensors are views of `device`
    std::vector<int64_t> table_widths;  // per KV group
    int64_t rows = 0, selected = 0;
    Tensor device;                // I32 [packed.size()] once uploaded
    Tensor tokens, logit_rows;
    std::vector<Tensor> block_tables;
    Tensor capture_rows;          // with capture_hidden_after: I32 [rows], 0..rows-1
    // LoRA: each row's adapter slot (-1: none), packed after the logit rows when LoRA is enabled; any_lora: some row
    // has one (otherwise no LoRA op runs).
    Tensor row_adapters;
    bool any_lora = false;
  };
  // The inputs of a validated batch. `pad_sequences` > the batch's sequences appends sequences of `pad_rows` rows at
  // positions 0.. with no blocks (their rows compute NaN and write nothing), the last row of each following in the
  // logit rows; `table_widths` (per KV group, or empty) widens the block tables, so that steps of different lengths
  // share one layout. A verify step pads with sequences of its own rows (1 + k), so that its shape depends on the
  // bucket and k only, not on how many sequences fill the bucket.
  StepInputs prepare(const ForwardBatch& batch, const KvCacheLayout& layout, int32_t pad_sequences = 0,
                     const std::vector<int64_t>& table_widths = {}, int32_t pad_rows = 1) const;
  // Allocates inputs.device, copies `packed` there, and makes the tensors views of it.
  void upload(StepInputs& inputs) const;
  // Writes the batch's deferred tokens (the previous step's device samples, `token_source`) into uploaded `tokens`.
  void place_deferred_tokens(const ForwardBatch& batch, const Tensor& token_source, Tensor& tokens) const;
  // The layers and the LM head over uploaded inputs: logits [inputs.selected, vocab]. `routed_experts`: as forward()'s,
  // with inputs.rows rows.
  Tensor run(const StepInputs& inputs, KvCacheView cache, const Tensor& routed_experts = {});
  void validate(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source) const;
  // AttentionParams of layer `i`.
  AttentionParams attention_params(std::size_t layer, const KvCacheLayout& layout) const;
  std::size_t num_layers() const { return layers_.size(); }
  // The MoE layers (routing replay's second axis), in layer order.
  int64_t num_moe_layers() const;

  // LoRA (docs/lora.md): room for `max_loras` adapters of rank up to `max_rank`, one per slot, which each sequence of a
  // step picks by SequenceSlice::lora_slot. Once, before the first step; not for a distributed model.
  void enable_lora(int32_t max_loras, int64_t max_rank);
  int32_t max_loras() const { return max_loras_; }
  // Puts `adapter` in `slot`, replacing what was there (between steps). A projection's stacked adapters are allocated
  // (zeroed) when the first adapter that adapts it arrives. Error naming the module for one the model lacks, a rank
  // above max_rank or a wrong size; then the slot must not be used until a load succeeds.
  void load_lora(int32_t slot, const LoraWeights& adapter);
  // Bytes the loaded adapters take on the backend: attention's stacked tensors and the MLP tables (docs/lora.md).
  int64_t lora_bytes() const;

  // Block drafting (spec/block_drafter.h) reads the residual stream right after these layers (0-based, after both
  // residual adds) for every row of each step: after forward(), captured_hidden() is F32 [layers.size(), rows, hidden]
  // in that order (a recorded decode graph writes its own buffer: runner/decode_graphs.h hands it out). Empty (the
  // default): nothing is captured, nothing is spent.
  void capture_hidden_after(std::vector<int64_t> layers);
  const Tensor& captured_hidden() const { return captured_; }
  // vLLM's per-tensor FP8 KV cache scales: F32 [num_hidden_layers, 2] on the backend, row l layer l's (k_scale,
  // v_scale): the checkpoint's self_attn.k_scale / v_scale, 1.0 where it has none (warned about once, at the first
  // step on an FP8 pool), or computed by the first step after calculate_kv_scales(). Row l is PagedKvPool::scales of
  // layer l's write_kv and paged_attention; it is only ever written in place, so recorded decode graphs read the
  // current values.
  const Tensor& kv_scales() const { return kv_scales_; }
  // vLLM's --calculate-kv-scales: the next forward step sets each layer's scales from that step's K and V before
  // writing them (k_scale = max|k| / kKScaleConstant, v_scale = max|v| / kVScaleConstant, on the device:
  // Backend::amax_scale); later steps keep them.
  void calculate_kv_scales() { calculate_kv_scales_ = true; }
  bool kv_scales_pending() const { return calculate_kv_scales_; }
  // vLLM's K_SCALE_CONSTANT and V_SCALE_CONSTANT (their defaults): the headroom left under E4M3's ±448.
  static constexpr float kKScaleConstant = 200.0f, kVScaleConstant = 100.0f;
  // New weights for a served model keep the KV cache's scales: `other`'s values (same layers), and its pending
  // calculation.
  void inherit_kv_scales(const BeamModel& other);

  // The pieces a drafter shares with the target (first and last pipeline stage: a whole model).
  const Tensor& embed_tokens() const { return embed_tokens_; }
  const Tensor& final_norm() const { return final_norm_; }
  const LinearTensors& lm_head() const { return lm_head_; }

 private:
  // A layer's LoRA adapters, absent until some adapter adapts the projection: attention stacked slot-major at
  // --max-lora-rank; the MLP's at their true ranks (model/lora_table.h: entry slot * experts + expert). A dense MLP
  // takes moe_lora as one expert (`dense`) routed with weight 1.
  struct LayerLora {
    LoraTensors q, k, v, o;
    std::shared_ptr<LoraTableStore> gate, up, down;
    MoeTensors dense;
    bool mlp_defined() const { return gate != nullptr || up != nullptr || down != nullptr; }
  };

  struct Layer {
    Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    LinearTensors q, k, v, o;
    bool sliding = false;
    bool moe = false;
    SwigluTensors mlp;  // dense layers
    MoeTensors experts; // MoE layers
    LayerLora lora;
  };

  // The stacked adapters of attention projection `projection` (Q, K, V or O) in `layer`.
  static LoraTensors& lora_tensors(Layer& layer, LoraProjection projection);
  // The table of MLP projection `projection` (Gate, Up or Down) in `layer`.
  static std::shared_ptr<LoraTableStore>& lora_table(Layer& layer, LoraProjection projection);
  // Puts `adapter`'s attention modules of one projection in `slot` (zeros where it has none).
  void load_attention_lora(int32_t slot, Layer& layer, LoraProjection projection,
                           const std::vector<const LoraModule*>* modules);
  // Puts `adapter`'s MLP modules of one projection (by expert) in `slot`'s entries of the layer's table.
  void load_mlp_lora(int32_t slot, Layer& layer, LoraProjection projection,
                     const std::vector<const LoraModule*>* modules);
  // y += the LoRA of the step's rows (nothing when none has an adapter or none adapts this projection).
  void apply_lora(const LoraTensors& lora, const Tensor& x, const StepInputs& inputs, Tensor& y);
  // The SwiGLU of a dense layer over h into branch, with its rows' LoRA: moe_lora with one expert of weight 1.
  void dense_mlp_lora(const Layer& layer, const Tensor& h, const SwigluLora& lora, Tensor& branch);
  // The layer's MLP adapters with the step's row slots, when a row of the step may need them; nullopt otherwise.
  std::optional<SwigluLora> step_mlp_lora(const Layer& layer, const StepInputs& inputs) const;

  // The MoE block of one layer under expert parallelism: the router and this rank's experts over h into branch, with
  // the collectives of the layout. `h_rows`/`branch_rows` are h and branch padded to the largest batch of the
  // data-parallel group. `expert_ids`: where the router's choices go (a slice of forward()'s routed_experts), or
  // undefined. `reduce` false: branch is left as this rank's partial, for the fused all-reduce + norm (no
  // data-parallel expert exchange then). (LoRA is refused on distributed models: enable_lora.)
  void moe_block(const Layer& layer, const Tensor& h_rows, Tensor& branch_rows, const Tensor& h, Tensor& branch,
                 Tensor expert_ids, bool reduce);
  // Without expert parallelism (every expert here, whole or split by its intermediate): the experts of the router's
  // choices over h into branch, summed over the tensor-parallel group unless `reduce` is false (the fused
  // all-reduce + norm sums it); `lora`: the experts' adapters for this step (step_mlp_lora), or null.
  void local_experts(const Layer& layer, const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                     const SwigluLora* lora, Tensor& branch, bool reduce);
  bool expert_parallel() const;
  // Pipeline parallelism: the last stage sends run()'s logits ([selected, vocab]) to the first, which samples; other
  // stages pass theirs (undefined) through.
  Tensor logits_to_first_stage(Tensor logits, int64_t selected) const;
  // Sequences [begin, end) of `batch` as a batch of their own (rows and logit rows renumbered).
  static ForwardBatch sub_batch(const ForwardBatch& batch, std::size_t begin, std::size_t end);
  // forward() of a validated batch as micro-batches in flight through the stages; its logits in the batch's order.
  Tensor forward_micro_batches(const ForwardBatch& batch, const std::vector<std::size_t>& bounds, KvCacheView cache);
  // Keeps the choices of this rank's experts, renumbered from 0; the others get weight 0 (expert parallelism).
  // `captured` (routing replay), when defined, first gets the router's ids of rows [captured_row, + its rows).
  void keep_own_experts(Tensor& expert_ids, Tensor& expert_weights, Tensor captured, int64_t captured_row) const;
  // The MoE layers among layers [0, layer).
  int64_t moe_layers_before(int64_t layer) const;
  // Pipeline parallelism, routing replay: each later stage sends its MoE layers' slices of forward()'s routed_experts
  // to the first stage, which receives them into its own (before logits_to_first_stage, in stage order).
  void routed_experts_to_first_stage(const Tensor& routed_experts) const;
  // tensor = its sum over the tensor-parallel group (row-parallel projections' partial sums).
  void reduce_tensor_parallel(Tensor& tensor) const;
  // The sandwich norm after a block: x += residual_scale * rms(branch, weight), then (next_weight non-null)
  // h = rms(x, next_weight). `fused`: branch is this rank's partial in the fused all-reduce's memory, summed over the
  // tensor-parallel group inside the norm's kernel; otherwise branch is whole already.
  void sandwich_norm(bool fused, const Tensor& branch, Tensor& x, const Tensor& weight, const Tensor* next_weight,
                     Tensor& h);

  BeamWeights weights_;
  ModelConfig config_;
  ModelShard shard_;
  ParallelGroups* groups_ = nullptr;
  Backend& backend_;
  Tensor embed_tokens_, final_norm_;
  LinearTensors lm_head_;
  std::vector<Layer> layers_;
  std::vector<int64_t> capture_layers_;
  int32_t max_loras_ = 0;
  int64_t max_lora_rank_ = 0;
  // A dense MLP's LoRA routes every row to its one expert with weight 1: I32 / F32 [capacity, 1], capacities doubling
  // (dense_mlp_lora reads the first rows of the last).
  struct DenseLoraRoute {
    Tensor expert, weight;
  };
  std::vector<DenseLoraRoute> dense_lora_routes_;
  Tensor captured_;
  Tensor kv_scales_;
  bool calculate_kv_scales_ = false;
  std::vector<int64_t> layers_without_kv_scales_;  // this rank's layers that the checkpoint gives no scales
  bool kv_scales_warned_ = false;
  // The layer's view for write_kv and paged_attention: the pool with its row of kv_scales_; the first step after
  // calculate_kv_scales() fills that row from k and v first. Warns once about missing scales on an FP8 pool.
  PagedKvPool layer_kv_pool(int64_t layer, const PagedKvPool& pool, const Tensor& k, const Tensor& v);
};

}  // namespace beamline
