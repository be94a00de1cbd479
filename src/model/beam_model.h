#pragma once
// The Beam forward pass (docs/model-format.md §4), written once against the Backend op set.
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward_batch.h"
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
  // What the model was built from (a new model with some tensors replaced starts from these).
  const BeamWeights& weights() const { return weights_; }
  Backend& backend() const { return backend_; }

  // One step over a varlen batch: writes the K/V of every new token into `cache` (through the batch's block
  // tables), attends over the cache, and returns the soft-capped logits of batch.logit_rows as an F32 tensor
  // [logit_rows.size(), vocab_size] on the backend. Validates the batch (token ids, row ranges, block table
  // coverage) and throws beamline::Error naming the field. `token_source` (I32 [N] on this backend) holds the
  // previous step's sampled tokens that batch.deferred_tokens read; a batch without them needs none.
  // `routed_experts` (routing replay, --enable-return-routed-experts), when defined: I32 [num_moe_layers(), rows,
  // top_k] on this backend, rows the step's token rows; the router writes each MoE layer's expert ids (its top-k, in
  // order of selection) straight into that layer's slice, so capturing them costs no extra device work.
  Tensor forward(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source = {},
                 const Tensor& routed_experts = {});
  // forward() of a batch that validate() has passed.
  Tensor forward_validated(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source,
                           const Tensor& routed_experts = {});

  // The same in three parts, for recorded steps (runner/decode_graphs.h): what a step reads besides weights and
  // cache, all I32, packed on the host so that it reaches the device in one copy and, for a graph, into the same
  // buffer every step.
  struct StepInputs {
    std::vector<int32_t> packed;  // tokens | positions | row_sequence | query_start | seq_lens | tables | logit rows
    AttentionBatch attention;     // host copies; its tensors are views of `device`
    std::vector<int64_t> table_widths;  // per KV group
    int64_t rows = 0, selected = 0;
    Tensor device;                // I32 [packed.size()] once uploaded
    Tensor tokens, logit_rows;
    std::vector<Tensor> block_tables;
  };
  // The inputs of a validated batch. `pad_sequences` > the batch's sequences appends one-token sequences at
  // position 0 with no blocks (their rows compute NaN and write nothing) whose rows follow in the logit rows;
  // `table_widths` (per KV group, or empty) widens the block tables, so that steps of different lengths share
  // one layout.
  StepInputs prepare(const ForwardBatch& batch, const KvCacheLayout& layout, int32_t pad_sequences = 0,
                     const std::vector<int64_t>& table_widths = {}) const;
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

  // Block drafting (spec/block_drafter.h) reads the residual stream right after these layers (0-based, after both
  // residual adds) for every row of each step: after forward(), captured_hidden() is F32 [layers.size(), rows, hidden]
  // in that order. Empty (the default): nothing is captured, nothing is spent.
  void capture_hidden_after(std::vector<int64_t> layers);
  const Tensor& captured_hidden() const { return captured_; }
  // The pieces a drafter shares with the target (first and last pipeline stage: a whole model).
  const Tensor& embed_tokens() const { return embed_tokens_; }
  const Tensor& final_norm() const { return final_norm_; }
  const LinearTensors& lm_head() const { return lm_head_; }

 private:
  struct Layer {
    Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    LinearTensors q, k, v, o;
    bool sliding = false;
    bool moe = false;
    SwigluTensors mlp;  // dense layers
    MoeTensors experts; // MoE layers
  };

  // The MoE block of one layer: routed experts over h into branch, with the collectives of the parallel layout.
  // `h_rows`/`branch_rows` are h and branch padded to the largest batch of the data-parallel group.
  // `expert_ids`: where the router's choices go (a slice of forward()'s routed_experts), or undefined.
  void moe_block(const Layer& layer, const Tensor& h_rows, Tensor& branch_rows, const Tensor& h, Tensor& branch,
                 Tensor expert_ids);
  // Keeps the choices of this rank's experts, renumbered from 0; the others get weight 0 (expert parallelism).
  void keep_own_experts(Tensor& expert_ids, Tensor& expert_weights) const;
  // tensor = its sum over the tensor-parallel group (row-parallel projections' partial sums).
  void reduce_tensor_parallel(Tensor& tensor) const;

  BeamWeights weights_;
  ModelConfig config_;
  ModelShard shard_;
  ParallelGroups* groups_ = nullptr;
  Backend& backend_;
  Tensor embed_tokens_, final_norm_;
  LinearTensors lm_head_;
  std::vector<Layer> layers_;
  std::vector<int64_t> capture_layers_;
  Tensor captured_;
};

}  // namespace beamline
