#include "model/beam_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>

#include "util/counter_random.h"
#include "util/error.h"

namespace beamline {
namespace {

// A checkpoint tensor handed to the backend, or for a random model (dummy_weights) drawn by it, unless the host
// already holds its bytes: a dummy model's slices drawn on the host (checkpoint/shard_weights.h) or its projections
// quantized at load (checkpoint/quantize_tensors.h).
Tensor materialise(Backend& backend, const BeamWeights& weights, const TensorView& view) {
  if (!weights.random_seed || view.data != nullptr) return backend.load_weight(view);
  const RandomInit& init = weights.random_inits.at(view.name);
  return backend.random_weight(view.dtype, view.shape, stream_key(*weights.random_seed, view.name), init.mean,
                               init.stddev);
}

LinearTensors load_linear(Backend& backend, const BeamWeights& weights, const LinearWeight& weight) {
  LinearTensors tensors;
  tensors.weight = materialise(backend, weights, weight.weight);
  if (weight.scale.data) tensors.scale = backend.load_weight(weight.scale);
  if (weight.scale_2.data) tensors.scale_2 = backend.load_weight(weight.scale_2);
  return tensors;
}

SwigluTensors load_swiglu(Backend& backend, const BeamWeights& weights, const ExpertWeights& expert) {
  return {load_linear(backend, weights, expert.gate_proj), load_linear(backend, weights, expert.up_proj),
          load_linear(backend, weights, expert.down_proj)};
}

// The tensors a shard loads: its stage's layers (with only its experts), the embeddings on the first stage, the final
// norm and LM head on the last.
std::vector<const TensorView*> used_views(const BeamWeights& weights, const ModelShard& shard) {
  std::vector<const TensorView*> views;
  auto add_linear = [&](const LinearWeight& weight) {
    for (const TensorView* view : {&weight.weight, &weight.scale, &weight.scale_2})
      if (!view->shape.empty() && (view == &weight.weight || view->data != nullptr)) views.push_back(view);
  };
  auto add_swiglu = [&](const ExpertWeights& mlp) {
    for (const LinearWeight* weight : {&mlp.gate_proj, &mlp.up_proj, &mlp.down_proj}) add_linear(*weight);
  };
  if (shard.layer_begin == 0) views.push_back(&weights.embed_tokens);
  if (shard.layer_end == weights.config.num_hidden_layers) {
    views.push_back(&weights.norm);
    add_linear(weights.lm_head);
  }
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    const LayerWeights& layer = weights.layers.at(static_cast<std::size_t>(i));
    for (const TensorView* view : {&layer.input_layernorm, &layer.post_attention_layernorm,
                                   &layer.pre_feedforward_layernorm, &layer.post_feedforward_layernorm})
      views.push_back(view);
    for (const LinearWeight* weight : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj}) add_linear(*weight);
    if (layer.mlp) add_swiglu(*layer.mlp);
    if (!layer.experts.empty()) {
      views.push_back(&layer.router);
      views.push_back(&layer.router_bias);
      for (int64_t e = shard.expert_begin; e < shard.expert_end; ++e) add_swiglu(layer.experts.at(static_cast<std::size_t>(e)));
    }
  }
  return views;
}

}  // namespace

RouterParams router_params(const ModelConfig& config) {
  return {static_cast<int32_t>(config.n_group), static_cast<int32_t>(config.topk_group),
          static_cast<int32_t>(config.num_experts_per_tok), config.norm_topk_prob,
          static_cast<float>(config.routed_scaling_factor)};
}

BeamModel::BeamModel(const BeamWeights& weights, Backend& backend)
    : BeamModel(weights, backend, ModelShard::whole(weights.config), nullptr) {}

BeamModel::BeamModel(const BeamWeights& weights, Backend& backend, const ModelShard& shard, ParallelGroups* groups)
    : weights_(weights), config_(weights.config), shard_(shard), groups_(groups), backend_(backend) {
  const ModelConfig& config = weights_.config;
  require(groups_ != nullptr || shard_.whole_model(config), "model: a shard of the model needs its parallel groups");
  require(static_cast<int64_t>(weights_.layers.size()) == config.num_hidden_layers,
          "model: {} layers of weights for num_hidden_layers {}", weights_.layers.size(), config.num_hidden_layers);
  config_.num_attention_heads = shard_.q_heads;
  config_.num_key_value_heads = shard_.kv_heads;
  const bool first_stage = shard_.layer_begin == 0, last_stage = shard_.layer_end == config.num_hidden_layers;
  std::vector<std::size_t> sizes;
  for (const TensorView* view : used_views(weights_, shard_))
    sizes.push_back(static_cast<std::size_t>(view->numel()) * dtype_size(view->dtype));
  backend_.reserve_weights(sizes);
  if (first_stage) embed_tokens_ = materialise(backend_, weights_, weights_.embed_tokens);
  if (last_stage) {
    final_norm_ = materialise(backend_, weights_, weights_.norm);
    lm_head_ = load_linear(backend_, weights_, weights_.lm_head);
    require(lm_head_.out_features() == shard_.vocab_size, "model: lm_head has {} rows, this rank's shard {}",
            lm_head_.out_features(), shard_.vocab_size);
  }
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const LayerWeights& source = weights_.layers[static_cast<std::size_t>(i)];
    Layer layer;
    layer.sliding = config.layer_types.at(static_cast<std::size_t>(i)) == LayerType::Sliding;
    layer.moe = config.is_moe_layer(i);
    if (!shard_.owns_layer(i)) {  // another pipeline stage's
      layers_.push_back(std::move(layer));
      continue;
    }
    layer.input_norm = materialise(backend_, weights_, source.input_layernorm);
    layer.post_attention_norm = materialise(backend_, weights_, source.post_attention_layernorm);
    layer.pre_feedforward_norm = materialise(backend_, weights_, source.pre_feedforward_layernorm);
    layer.post_feedforward_norm = materialise(backend_, weights_, source.post_feedforward_layernorm);
    layer.q = load_linear(backend_, weights_, source.q_proj);
    layer.k = load_linear(backend_, weights_, source.k_proj);
    layer.v = load_linear(backend_, weights_, source.v_proj);
    layer.o = load_linear(backend_, weights_, source.o_proj);
    require(layer.q.out_features() == shard_.q_heads * config.head_dim &&
                layer.k.out_features() == shard_.kv_heads * config.head_dim,
            "model: layer {} has q/k projections of {}/{} rows, this rank's heads need {}/{} (weights not sharded?)", i,
            layer.q.out_features(), layer.k.out_features(), shard_.q_heads * config.head_dim,
            shard_.kv_heads * config.head_dim);
    if (layer.moe) {
      require(static_cast<int64_t>(source.experts.size()) == config.n_routed_experts,
              "model: layer {} has {} experts, config says {}", i, source.experts.size(), config.n_routed_experts);
      layer.experts.router = materialise(backend_, weights_, source.router);
      layer.experts.router_bias = materialise(backend_, weights_, source.router_bias);
      for (int64_t e = shard_.expert_begin; e < shard_.expert_end; ++e)
        layer.experts.experts.push_back(load_swiglu(backend_, weights_, source.experts[static_cast<std::size_t>(e)]));
      backend_.prepare_moe(layer.experts);
    } else {
      require(source.mlp.has_value(), "model: dense layer {} has no mlp weights", i);
      layer.mlp = load_swiglu(backend_, weights_, *source.mlp);
    }
    layers_.push_back(std::move(layer));
  }
  std::vector<float> scales(static_cast<std::size_t>(2 * config.num_hidden_layers), 1.0f);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const LayerWeights& source = weights_.layers[static_cast<std::size_t>(i)];
    if (source.k_scale) scales[static_cast<std::size_t>(2 * i)] = *source.k_scale;
    if (source.v_scale) scales[static_cast<std::size_t>(2 * i + 1)] = *source.v_scale;
    if (shard_.owns_layer(i) && (!source.k_scale || !source.v_scale)) layers_without_kv_scales_.push_back(i);
  }
  kv_scales_ = backend_.upload_f32(scales, {config.num_hidden_layers, 2});
}

void BeamModel::inherit_kv_scales(const BeamModel& other) {
  require(other.kv_scales_.shape() == kv_scales_.shape(), "model: KV scales {} cannot take over {}",
          describe(kv_scales_), describe(other.kv_scales_));
  const std::vector<float> scales = other.backend_.download_f32(other.kv_scales_);
  backend_.copy_to(kv_scales_, scales.data());
  calculate_kv_scales_ = other.calculate_kv_scales_;
  kv_scales_warned_ = other.kv_scales_warned_;
}

PagedKvPool BeamModel::layer_kv_pool(int64_t layer, const PagedKvPool& pool, const Tensor& k, const Tensor& v) {
  if (calculate_kv_scales_) {
    Tensor k_scale = kv_scales_.view(2 * layer, {1}), v_scale = kv_scales_.view(2 * layer + 1, {1});
    backend_.amax_scale(k, kKScaleConstant, k_scale);
    backend_.amax_scale(v, kVScaleConstant, v_scale);
  } else if (pool.k.dtype() == DType::F8_E4M3 && !kv_scales_warned_ && !layers_without_kv_scales_.empty()) {
    spdlog::warn("FP8 KV cache: the checkpoint has no self_attn.k_scale / v_scale for {} layer(s) ({}{}): they use "
                 "1.0 (E4M3 saturates at ±448); --calculate-kv-scales computes them from the first step",
                 layers_without_kv_scales_.size(),
                 fmt::join(layers_without_kv_scales_.begin(),
                           layers_without_kv_scales_.begin() +
                               static_cast<std::ptrdiff_t>(std::min<std::size_t>(layers_without_kv_scales_.size(), 8)),
                           ", "),
                 layers_without_kv_scales_.size() > 8 ? ", ..." : "");
    kv_scales_warned_ = true;
  }
  return {pool.k, pool.v, kv_scales_.view(2 * layer, {2})};
}

void BeamModel::validate(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source) const {
  const ModelConfig& config = config_;
  const KvCacheLayout& layout = cache.layout;
  require(!batch.tokens.empty(), "forward batch: no tokens");
  require(!batch.sequences.empty(), "forward batch: no sequences");
  require(static_cast<int64_t>(layout.layer_group.size()) == config.num_hidden_layers &&
              layout.layer_slot.size() == layout.layer_group.size(),
          "forward batch: the KV layout covers {} layers, the model has {}", layout.layer_group.size(),
          config.num_hidden_layers);
  for (std::size_t i = 0; i < batch.tokens.size(); ++i)
    require(batch.tokens[i] >= 0 && batch.tokens[i] < config.vocab_size,
            "forward batch: token id {} at row {} is outside the vocabulary of {}", batch.tokens[i], i,
            config.vocab_size);
  int32_t expected_begin = 0;
  for (std::size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& sequence = batch.sequences[s];
    require(sequence.token_begin == expected_begin && sequence.token_end > sequence.token_begin,
            "forward batch: sequence {} covers rows [{}, {}); expected a non-empty range starting at row {}", s,
            sequence.token_begin, sequence.token_end, expected_begin);
    expected_begin = sequence.token_end;
    require(sequence.context_begin >= 0, "forward batch: sequence {} has context_begin {}", s, sequence.context_begin);
    require(sequence.lora_slot >= -1 && sequence.lora_slot < max_loras_,
            "forward batch: sequence {} asks for LoRA slot {} of {} (--max-loras)", s, sequence.lora_slot, max_loras_);
    require(static_cast<int32_t>(sequence.block_tables.size()) == layout.num_groups(),
            "forward batch: sequence {} has {} block tables for {} KV groups", s, sequence.block_tables.size(),
            layout.num_groups());
    const int64_t length = int64_t{sequence.context_begin} + sequence.token_end - sequence.token_begin;
    for (std::size_t g = 0; g < sequence.block_tables.size(); ++g) {
      const auto& table = sequence.block_tables[g];
      require(static_cast<int64_t>(table.size()) * layout.block_size >= length,
              "forward batch: block table {} of sequence {} covers {} positions, needs {}", g, s,
              table.size() * static_cast<std::size_t>(layout.block_size), length);
      for (int32_t block : table)
        require(block == kNullBlock || (block >= 0 && block < layout.num_blocks),
                "forward batch: block table {} of sequence {} names block {} of a pool of {}", g, s, block,
                layout.num_blocks);
    }
  }
  require(expected_begin == static_cast<int32_t>(batch.tokens.size()),
          "forward batch: the sequences cover {} rows of {} tokens", expected_begin, batch.tokens.size());
  if (!batch.deferred_tokens.empty()) {
    require(token_source.rank() == 1 && token_source.dtype() == DType::I32 &&
                token_source.device() == backend_.device(),
            "forward batch: token_source {} must be an I32 vector on the {} backend", describe(token_source),
            backend_.name());
    for (const DeferredToken& deferred : batch.deferred_tokens)
      require(deferred.row >= 0 && deferred.row < static_cast<int32_t>(batch.tokens.size()) && deferred.source >= 0 &&
                  deferred.source < token_source.dim(0),
              "forward batch: deferred token (row {}, source {}) is outside the {} rows or the {} sampled tokens",
              deferred.row, deferred.source, batch.tokens.size(), token_source.dim(0));
  }
  require(!batch.logit_rows.empty(), "forward batch: no logit rows requested");
  for (int32_t row : batch.logit_rows)
    require(row >= 0 && row < static_cast<int32_t>(batch.tokens.size()),
            "forward batch: logit row {} is outside the {} tokens", row, batch.tokens.size());
}

Tensor BeamModel::forward(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source,
                          const Tensor& routed_experts) {
  validate(batch, cache, token_source);
  return forward_validated(batch, cache, token_source, routed_experts);
}

Tensor BeamModel::forward_validated(const ForwardBatch& batch, KvCacheView cache, const Tensor& token_source,
                                    const Tensor& routed_experts) {
  if (const std::vector<std::size_t> bounds = micro_batch_bounds(batch); bounds.size() > 2) {
    require(!token_source.defined() && !routed_experts.defined(),
            "model: pipeline micro-batches take no deferred tokens or routed-experts capture (the runner of a "
            "distributed model resolves and refuses them)");
    return forward_micro_batches(batch, bounds, cache);
  }
  StepInputs inputs = prepare(batch, cache.layout);
  upload(inputs);
  place_deferred_tokens(batch, token_source, inputs.tokens);
  Tensor logits = run(inputs, cache, routed_experts);
  routed_experts_to_first_stage(routed_experts);
  return logits_to_first_stage(std::move(logits), inputs.selected);
}

int64_t BeamModel::moe_layers_before(int64_t layer) const {
  return std::count_if(layers_.begin(), layers_.begin() + layer, [](const Layer& each) { return each.moe; });
}

void BeamModel::routed_experts_to_first_stage(const Tensor& routed_experts) const {
  if (!routed_experts.defined() || groups_ == nullptr || groups_->config.pipeline == 1) return;
  const int64_t rows = routed_experts.dim(1), top_k = routed_experts.dim(2);
  // Stage p's MoE layers are one contiguous run of routed_experts' [moe_layers, rows, top_k].
  auto stage_slices = [&](const ModelShard& stage) {
    const int64_t first = moe_layers_before(stage.layer_begin), count = moe_layers_before(stage.layer_end) - first;
    return count == 0 ? Tensor() : routed_experts.view(first * rows * top_k, {count, rows, top_k});
  };
  if (!groups_->first_stage()) {
    if (const Tensor own = stage_slices(shard_); own.defined()) groups_->pipeline->send(own, 0);
    return;
  }
  for (int32_t stage = 1; stage < groups_->config.pipeline; ++stage) {
    RankCoordinates at = groups_->at;
    at.pipeline = stage;
    if (Tensor theirs = stage_slices(model_shard(weights_.config, groups_->config, at)); theirs.defined())
      groups_->pipeline->recv(theirs, stage);
  }
}

void BeamModel::place_deferred_tokens(const ForwardBatch& batch, const Tensor& token_source, Tensor& tokens) const {
  if (batch.deferred_tokens.empty()) return;
  std::vector<int32_t> pairs;
  pairs.reserve(2 * batch.deferred_tokens.size());
  for (const DeferredToken& deferred : batch.deferred_tokens)
    pairs.insert(pairs.end(), {deferred.row, deferred.source});
  backend_.place_tokens(token_source, pairs, tokens);
}

BeamModel::StepInputs BeamModel::prepare(const ForwardBatch& batch, const KvCacheLayout& layout, int32_t pad_sequences,
                                         const std::vector<int64_t>& table_widths, int32_t pad_rows) const {
  require(pad_rows >= 1, "step inputs: padding sequences of {} rows", pad_rows);
  const auto real_sequences = static_cast<int32_t>(batch.sequences.size());
  const int32_t sequences = std::max(real_sequences, pad_sequences);
  const int32_t padding = sequences - real_sequences;
  const auto real_rows = static_cast<int32_t>(batch.tokens.size());
  StepInputs inputs;
  inputs.rows = real_rows + padding * pad_rows;
  // Padding sequences select every row: a verify step's real sequences do too, so a bucket's step has one shape (its
  // logits' rows included) whatever the number of real sequences.
  inputs.selected = static_cast<int64_t>(batch.logit_rows.size()) + int64_t{padding} * pad_rows;

  std::vector<int32_t> positions, query_start{0}, seq_lens;
  for (const SequenceSlice& sequence : batch.sequences) {
    for (int32_t r = sequence.token_begin; r < sequence.token_end; ++r)
      positions.push_back(sequence.context_begin + (r - sequence.token_begin));
    query_start.push_back(sequence.token_end);
    seq_lens.push_back(sequence.context_begin + (sequence.token_end - sequence.token_begin));
  }
  for (int32_t p = 0; p < padding; ++p) {
    for (int32_t r = 0; r < pad_rows; ++r) positions.push_back(r);
    query_start.push_back(real_rows + (p + 1) * pad_rows);
    seq_lens.push_back(pad_rows);
  }
  inputs.attention = Backend::describe_attention_batch(std::move(positions), std::move(query_start), std::move(seq_lens));

  std::vector<int32_t>& packed = inputs.packed;
  packed = batch.tokens;
  packed.resize(static_cast<std::size_t>(inputs.rows), 0);
  for (const std::vector<int32_t>* part : {&inputs.attention.host_positions, &inputs.attention.host_row_sequence,
                                           &inputs.attention.host_query_start, &inputs.attention.host_seq_lens})
    packed.insert(packed.end(), part->begin(), part->end());
  for (int32_t group = 0; group < layout.num_groups(); ++group) {
    std::size_t width = 1;
    for (const SequenceSlice& sequence : batch.sequences) width = std::max(width, sequence.block_tables[group].size());
    if (!table_widths.empty()) {
      require(static_cast<int64_t>(width) <= table_widths.at(static_cast<std::size_t>(group)),
              "forward batch: block table {} needs {} entries, more than the {} asked for", group, width,
              table_widths[static_cast<std::size_t>(group)]);
      width = static_cast<std::size_t>(table_widths[static_cast<std::size_t>(group)]);
    }
    inputs.table_widths.push_back(static_cast<int64_t>(width));
    const std::size_t start = packed.size();
    packed.resize(start + static_cast<std::size_t>(sequences) * width, kNullBlock);
    for (std::size_t s = 0; s < batch.sequences.size(); ++s)
      std::copy(batch.sequences[s].block_tables[group].begin(), batch.sequences[s].block_tables[group].end(),
                packed.begin() + static_cast<std::ptrdiff_t>(start + s * width));
  }
  packed.insert(packed.end(), batch.logit_rows.begin(), batch.logit_rows.end());
  for (int32_t row = real_rows; row < inputs.rows; ++row) packed.push_back(row);
  // With a drafter: the rows' identity, the gather indices that copy the residual stream into the capture (part of
  // the inputs, so that a recorded graph needs no upload of its own).
  if (!capture_layers_.empty())
    for (int32_t r = 0; r < static_cast<int32_t>(inputs.rows); ++r) packed.push_back(r);
  if (max_loras_ > 0) {
    for (const SequenceSlice& sequence : batch.sequences) {
      packed.insert(packed.end(), static_cast<std::size_t>(sequence.token_end - sequence.token_begin), sequence.lora_slot);
      inputs.any_lora = inputs.any_lora || sequence.lora_slot >= 0;
    }
    packed.insert(packed.end(), static_cast<std::size_t>(padding * pad_rows), -1);
  }
  return inputs;
}

void BeamModel::upload(StepInputs& inputs) const {
  const auto total = static_cast<int64_t>(inputs.packed.size());
  inputs.device = backend_.alloc(DType::I32, {total});
  backend_.copy_to(inputs.device, inputs.packed.data());
  const int64_t rows = inputs.rows, sequences = inputs.attention.num_sequences();
  int64_t at = 0;
  auto next = [&](std::vector<int64_t> shape) {
    Tensor view = inputs.device.view(at, shape);
    at += view.numel();
    return view;
  };
  inputs.tokens = next({rows});
  inputs.attention.positions = next({rows});
  inputs.attention.row_sequence = next({rows});
  inputs.attention.query_start = next({sequences + 1});
  inputs.attention.seq_lens = next({sequences});
  inputs.block_tables.clear();
  for (int64_t width : inputs.table_widths) inputs.block_tables.push_back(next({sequences, width}));
  inputs.logit_rows = next({inputs.selected});
  if (!capture_layers_.empty()) inputs.capture_rows = next({rows});
  if (max_loras_ > 0) inputs.row_adapters = next({rows});
  require(at == total, "step inputs: {} packed values, {} used", total, at);
}

AttentionParams BeamModel::attention_params(std::size_t layer, const KvCacheLayout& layout) const {
  const ModelConfig& config = config_;
  AttentionParams params;
  params.num_heads = static_cast<int32_t>(config.num_attention_heads);
  params.num_kv_heads = static_cast<int32_t>(config.num_key_value_heads);
  params.head_dim = static_cast<int32_t>(config.head_dim);
  params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)));
  params.sliding_window = layers_.at(layer).sliding ? static_cast<int32_t>(config.sliding_window) : 0;
  params.slot = layout.layer_slot.at(layer);
  return params;
}

std::set<std::string, std::less<>> BeamModel::loaded_tensor_names() const {
  std::set<std::string, std::less<>> names;
  for (const TensorView* view : used_views(weights_, shard_)) names.insert(view->name);
  return names;
}

int64_t BeamModel::num_moe_layers() const {
  return std::count_if(layers_.begin(), layers_.end(), [](const Layer& layer) { return layer.moe; });
}

Tensor BeamModel::run(const StepInputs& inputs, KvCacheView cache, const Tensor& routed_experts) {
  const ModelConfig& config = config_;
  const KvCacheLayout& layout = cache.layout;
  const int64_t rows = inputs.rows;
  const int64_t hidden = config.hidden_size, heads = config.num_attention_heads, kv_heads = config.num_key_value_heads,
                head_dim = config.head_dim, top_k = config.num_experts_per_tok;
  const auto eps = static_cast<float>(config.rms_norm_eps);
  const AttentionBatch& attention_batch = inputs.attention;
  const std::vector<Tensor>& block_tables = inputs.block_tables;
  const Tensor& tokens = inputs.tokens;
  // The experts of data-parallel ranks see every rank's rows, each rank's padded to the longest batch.
  int64_t padded_rows = rows;
  if (expert_parallel() && groups_->config.data > 1) padded_rows = groups_->data->all_reduce_max(rows);
  Tensor x = backend_.alloc(DType::F32, {rows, hidden});
  Tensor h_rows = backend_.alloc(DType::F32, {padded_rows, hidden});
  Tensor branch_rows = backend_.alloc(DType::F32, {padded_rows, hidden});
  if (padded_rows > rows) backend_.fill_zero(h_rows);
  Tensor h = padded_rows > rows ? h_rows.view(0, {rows, hidden}) : h_rows;
  Tensor branch = padded_rows > rows ? branch_rows.view(0, {rows, hidden}) : branch_rows;
  Tensor q = backend_.alloc(DType::F32, {rows, heads * head_dim});
  Tensor attention = backend_.alloc(DType::F32, {rows, heads * head_dim});
  Tensor k = backend_.alloc(DType::F32, {rows, kv_heads * head_dim});
  Tensor v = backend_.alloc(DType::F32, {rows, kv_heads * head_dim});
  const bool first_stage = shard_.layer_begin == 0, last_stage = shard_.layer_end == config.num_hidden_layers;
  if (routed_experts.defined()) {
    require_shape(routed_experts, {num_moe_layers(), rows, config.num_experts_per_tok}, "forward", "routed_experts");
    require_dtype(routed_experts, DType::I32, "forward", "routed_experts");
  }
  int64_t moe_index = moe_layers_before(shard_.layer_begin);  // this stage's first slice of routed_experts
  // Tensor parallelism: for decode-size steps the all-reduce after o_proj and after the MLP happens inside the sandwich
  // norm's kernel, over the partials that the block writes into memory its peers map (parallel/fused_all_reduce_norm.h).
  FusedAllReduceNorm* fused_norm = groups_ != nullptr ? groups_->fused_norm.get() : nullptr;
  const bool fused = fused_norm != nullptr && fused_norm->fused(rows, hidden);

  // embedding() over x with the rows' identity (inputs.capture_rows) copies the rows into the capture.
  if (!capture_layers_.empty())
    captured_ = backend_.alloc(DType::F32, {static_cast<int64_t>(capture_layers_.size()), rows, hidden});
  if (first_stage) {
    backend_.embedding(embed_tokens_, tokens, x);
  } else {
    groups_->pipeline->recv(x, groups_->at.pipeline - 1);
  }
  for (int64_t index = shard_.layer_begin; index < shard_.layer_end; ++index) {
    const auto i = static_cast<std::size_t>(index);
    const Layer& layer = layers_[i];
    // The shard's later layers get their input norm fused into the previous layer's residual add (below).
    if (index == shard_.layer_begin) backend_.rms_norm(x, layer.input_norm, eps, h);
    const std::array<const LinearTensors*, 3> qkv_weights{&layer.q, &layer.k, &layer.v};
    const std::array<Tensor*, 3> qkv{&q, &k, &v};
    backend_.linear_many(h, qkv_weights, qkv);
    apply_lora(layer.lora.q, h, inputs, q);
    apply_lora(layer.lora.k, h, inputs, k);
    apply_lora(layer.lora.v, h, inputs, v);
    if (layer.sliding) {
      backend_.rope_qk(q, k, attention_batch.positions, static_cast<int32_t>(heads), static_cast<int32_t>(kv_heads),
                       static_cast<int32_t>(head_dim), static_cast<float>(config.rope_theta));
    } else {
      backend_.ssmax_scale(q, attention_batch.positions, static_cast<float>(config.ssmax_base),
                           static_cast<float>(config.ssmax_exponent));
    }
    const Tensor& table = block_tables[static_cast<std::size_t>(layout.layer_group[i])];
    const AttentionParams params = attention_params(i, layout);
    PagedKvPool pool = layer_kv_pool(index, cache.pool, k, v);
    backend_.write_kv(k, v, pool, params.slot, table, attention_batch);
    backend_.paged_attention(q, pool, table, attention_batch, params, attention);
    Tensor attention_out = fused ? fused_norm->partial(rows, hidden) : branch;
    backend_.linear(attention, layer.o, attention_out);
    apply_lora(layer.lora.o, attention, inputs, attention_out);
    if (!fused) reduce_tensor_parallel(attention_out);
    // Expert parallelism over data-parallel replicas follows the MoE's all-reduce with a reduce-scatter: not fused.
    const bool fused_mlp = fused && !(layer.moe && groups_->expert && groups_->config.data > 1);
    Tensor mlp_out = fused_mlp ? fused_norm->partial(rows, hidden) : branch;
    const std::optional<SwigluLora> mlp_lora = step_mlp_lora(layer, inputs);
    const Tensor captured_experts =
        layer.moe && routed_experts.defined() ? routed_experts.slice_first(moe_index) : Tensor();
    if (layer.moe && !expert_parallel()) {  // the norms and the router as one op (a device folds them at decode)
      Tensor expert_ids = captured_experts.defined() ? captured_experts : backend_.alloc(DType::I32, {rows, top_k});
      Tensor expert_weights = backend_.alloc(DType::F32, {rows, top_k});
      if (fused) {  // the fused all-reduce makes h, the router reads it
        sandwich_norm(true, attention_out, x, layer.post_attention_norm, &layer.pre_feedforward_norm, h);
        backend_.route(h, layer.experts.router, layer.experts.router_bias, router_params(config_), expert_ids,
                       expert_weights);
      } else {
        backend_.add_rms_norm_then_route(x, attention_out, layer.post_attention_norm, eps,
                                         static_cast<float>(config.residual_scale), layer.pre_feedforward_norm, h,
                                         layer.experts.router, layer.experts.router_bias, router_params(config_),
                                         expert_ids, expert_weights);
      }
      local_experts(layer, h, expert_ids, expert_weights, mlp_lora ? &*mlp_lora : nullptr, mlp_out, !fused_mlp);
    } else {
      sandwich_norm(fused, attention_out, x, layer.post_attention_norm, &layer.pre_feedforward_norm, h);
    }
    if (layer.moe) {
      if (expert_parallel())
        moe_block(layer, h_rows, branch_rows, h, mlp_out, captured_experts, !fused_mlp);
      ++moe_index;
    } else if (mlp_lora) {
      dense_mlp_lora(layer, h, *mlp_lora, mlp_out);
    } else {
      backend_.swiglu(h, layer.mlp, mlp_out);
      if (!fused_mlp) reduce_tensor_parallel(mlp_out);
    }
    sandwich_norm(fused_mlp, mlp_out, x, layer.post_feedforward_norm,
                  index + 1 < shard_.layer_end ? &layers_[i + 1].input_norm : nullptr, h);
    for (std::size_t c = 0; c < capture_layers_.size(); ++c) {
      if (capture_layers_[c] != index) continue;
      Tensor slice = captured_.view(static_cast<int64_t>(c) * rows * hidden, {rows, hidden});
      backend_.embedding(x, inputs.capture_rows, slice);
    }
  }
  calculate_kv_scales_ = false;  // the first step's are kept (vLLM calculates them once)

  Tensor logits;
  if (!last_stage) {
    groups_->pipeline->send(x, groups_->at.pipeline + 1);
  } else {
    Tensor local = backend_.alloc(DType::F32, {inputs.selected, shard_.vocab_size});
    backend_.lm_head(x, inputs.logit_rows, final_norm_, eps, lm_head_,
                     static_cast<float>(config.final_logit_softcapping), local);
    logits = local;
    if (shard_.vocab_size < config.vocab_size) {  // vocabulary-parallel: every rank gets the whole rows
      logits = backend_.alloc(DType::F32, {inputs.selected, config.vocab_size});
      groups_->tensor->all_gather_columns(local, logits);
    }
  }
  return logits;
}

Tensor BeamModel::logits_to_first_stage(Tensor logits, int64_t selected) const {
  if (groups_ == nullptr || groups_->config.pipeline == 1) return logits;
  if (groups_->last_stage()) {
    groups_->pipeline->send(logits, 0);
  } else if (groups_->first_stage()) {
    logits = backend_.alloc(DType::F32, {selected, config_.vocab_size});
    groups_->pipeline->recv(logits, groups_->config.pipeline - 1);
  }
  return logits;
}

std::vector<std::size_t> BeamModel::micro_batch_bounds(const ForwardBatch& batch) const {
  const std::size_t sequences = batch.sequences.size();
  std::vector<std::size_t> bounds{0, sequences};
  if (groups_ == nullptr || groups_->config.pipeline == 1 || groups_->config.micro_batches() < 2 || sequences < 2)
    return bounds;
  // A step that captures the routing runs whole: routed_experts has one [rows, top_k] slab per MoE layer (every rank of
  // the stage decides this alike, capturing or not).
  if (batch.capture_routed_experts) return bounds;
  // Expert parallelism over data-parallel replicas pads every replica's rows per forward; micro-batches would have
  // to line up across replicas.
  if (groups_->expert && groups_->config.data > 1) return bounds;
  // The logits of the micro-batches are laid end to end: that is the batch's order only if its rows ascend.
  if (!std::is_sorted(batch.logit_rows.begin(), batch.logit_rows.end())) return bounds;
  const auto rows = static_cast<int64_t>(batch.tokens.size());
  // Every micro-batch reads the stage's weights again: worth it only where a step is compute-bound (prefill), not in
  // memory-bound decode steps, whose time would grow with the number of micro-batches.
  const auto parts = static_cast<std::size_t>(std::min<int64_t>(groups_->config.micro_batches(), rows / kMinMicroBatchRows));
  if (parts < 2) return bounds;
  std::size_t next_logit = 0;  // the first logit row not yet in a closed micro-batch
  bounds = {0};
  for (std::size_t s = 0; s < sequences; ++s) {
    const SequenceSlice& sequence = batch.sequences[s];
    const std::size_t logit_end = static_cast<std::size_t>(
        std::lower_bound(batch.logit_rows.begin(), batch.logit_rows.end(), sequence.token_end) -
        batch.logit_rows.begin());
    // Close a micro-batch at an equal share of the rows, if it has a logit row (run() needs one) and more follow.
    const bool share_reached =
        static_cast<int64_t>(bounds.size()) * rows <= static_cast<int64_t>(parts) * int64_t{sequence.token_end};
    if (share_reached && logit_end > next_logit && logit_end < batch.logit_rows.size() && bounds.size() < parts &&
        s + 1 < sequences) {
      bounds.push_back(s + 1);
      next_logit = logit_end;
    }
  }
  bounds.push_back(sequences);
  return bounds;
}

ForwardBatch BeamModel::sub_batch(const ForwardBatch& batch, std::size_t begin, std::size_t end) {
  ForwardBatch part;
  const int32_t first_row = batch.sequences[begin].token_begin, end_row = batch.sequences[end - 1].token_end;
  part.tokens.assign(batch.tokens.begin() + first_row, batch.tokens.begin() + end_row);
  for (std::size_t s = begin; s < end; ++s) {
    SequenceSlice sequence = batch.sequences[s];
    sequence.token_begin -= first_row;
    sequence.token_end -= first_row;
    part.sequences.push_back(std::move(sequence));
  }
  for (int32_t row : batch.logit_rows)
    if (row >= first_row && row < end_row) part.logit_rows.push_back(row - first_row);
  return part;
}

Tensor BeamModel::forward_micro_batches(const ForwardBatch& batch, const std::vector<std::size_t>& bounds,
                                        KvCacheView cache) {
  // Stage s runs micro-batch m while stage s + 1 runs m - 1: each stage sends a micro-batch's residual stream on as
  // soon as it has it. The last stage keeps the logits and hands them to the first once, at the end (per micro-batch,
  // its send would wait for a first stage still busy with the later ones, which wait for it: a deadlock).
  std::vector<Tensor> parts;
  for (std::size_t m = 0; m + 1 < bounds.size(); ++m) {
    StepInputs inputs = prepare(sub_batch(batch, bounds[m], bounds[m + 1]), cache.layout);
    upload(inputs);
    parts.push_back(run(inputs, cache));
  }
  const auto selected = static_cast<int64_t>(batch.logit_rows.size());
  Tensor logits;
  if (groups_->last_stage()) {  // the parts end to end (gathered by row index: the backends have no plain copy)
    logits = backend_.alloc(DType::F32, {selected, config_.vocab_size});
    int64_t at = 0;
    for (const Tensor& part : parts) {
      std::vector<int32_t> every_row(static_cast<std::size_t>(part.dim(0)));
      for (std::size_t r = 0; r < every_row.size(); ++r) every_row[r] = static_cast<int32_t>(r);
      Tensor rows = logits.view(at * config_.vocab_size, {part.dim(0), config_.vocab_size});
      backend_.embedding(part, backend_.upload_i32(every_row, {part.dim(0)}), rows);
      at += part.dim(0);
    }
  }
  return logits_to_first_stage(logits, selected);
}

void BeamModel::dummy_forward() {
  require(groups_ != nullptr && groups_->expert && groups_->config.data > 1,
          "model: a dummy step is for a data-parallel replica under expert parallelism");
  // The same row count exchange as run()'s, with none here.
  const int64_t padded_rows = groups_->data->all_reduce_max(0);
  Tensor h_rows = backend_.alloc(DType::F32, {padded_rows, config_.hidden_size});
  Tensor branch_rows = backend_.alloc(DType::F32, {padded_rows, config_.hidden_size});
  backend_.fill_zero(h_rows);
  for (int64_t index = shard_.layer_begin; index < shard_.layer_end; ++index) {
    const Layer& layer = layers_[static_cast<std::size_t>(index)];
    // Expert parallelism reads and writes only the padded rows (h and branch are for the other MoE paths).
    if (layer.moe) moe_block(layer, h_rows, branch_rows, h_rows, branch_rows, Tensor(), true);
  }
}

void BeamModel::capture_hidden_after(std::vector<int64_t> layers) {
  require(groups_ == nullptr, "model: capturing hidden states for a drafter needs the whole model on one process");
  for (const int64_t layer : layers)
    require(layer >= 0 && layer < config_.num_hidden_layers, "model: cannot capture after layer {} of {}", layer,
            config_.num_hidden_layers);
  capture_layers_ = std::move(layers);
}

void BeamModel::moe_block(const Layer& layer, const Tensor& h_rows, Tensor& branch_rows, const Tensor& h,
                          Tensor& branch, Tensor expert_ids, bool reduce) {
  const RouterParams router = router_params(config_);
  const int64_t top_k = config_.num_experts_per_tok;
  require(expert_parallel(), "model: moe_block is the expert-parallel MoE (local experts: local_experts)");
  // Expert parallelism: this rank's experts over the rows of every data-parallel rank (all-gather), each rank's
  // partial sums added up over the tensor-parallel group (all-reduce) and handed back by data-parallel rank
  // (reduce-scatter).
  const int32_t data = groups_->config.data;
  Tensor tokens = h, out = branch;
  if (data > 1) {
    tokens = backend_.alloc(DType::F32, {data * h_rows.dim(0), h_rows.dim(1)});
    groups_->data->all_gather(h_rows, tokens);
    out = backend_.alloc(DType::F32, tokens.shape());
  }
  const Tensor captured = expert_ids;  // this rank's rows, before keep_own_experts renumbers them
  expert_ids = backend_.alloc(DType::I32, {tokens.dim(0), top_k});
  Tensor expert_weights = backend_.alloc(DType::F32, {tokens.dim(0), top_k});
  backend_.route(tokens, layer.experts.router, layer.experts.router_bias, router, expert_ids, expert_weights);
  keep_own_experts(expert_ids, expert_weights, captured, groups_->at.data * h_rows.dim(0));
  backend_.moe(tokens, expert_ids, expert_weights, layer.experts, out);
  if (reduce) reduce_tensor_parallel(out);
  if (data > 1) groups_->data->reduce_scatter_sum(out, branch_rows);
}

void BeamModel::local_experts(const Layer& layer, const Tensor& h, const Tensor& expert_ids,
                              const Tensor& expert_weights, const SwigluLora* lora, Tensor& branch, bool reduce) {
  if (lora != nullptr)
    backend_.moe_lora(h, expert_ids, expert_weights, layer.experts, *lora, branch);
  else
    backend_.moe(h, expert_ids, expert_weights, layer.experts, branch);
  if (reduce) reduce_tensor_parallel(branch);
}

bool BeamModel::expert_parallel() const { return groups_ != nullptr && groups_->expert; }

void BeamModel::keep_own_experts(Tensor& expert_ids, Tensor& expert_weights, Tensor captured,
                                 int64_t captured_row) const {
  std::vector<int32_t> ids = backend_.download_i32(expert_ids);
  std::vector<float> weights = backend_.download_f32(expert_weights);
  if (captured.defined()) backend_.copy_to(captured, ids.data() + captured_row * expert_ids.dim(1));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= shard_.expert_begin && ids[i] < shard_.expert_end) {
      ids[i] -= static_cast<int32_t>(shard_.expert_begin);
    } else {
      ids[i] = 0;
      weights[i] = 0.0f;
    }
  }
  backend_.copy_to(expert_ids, ids.data());
  backend_.copy_to(expert_weights, weights.data());
}

void BeamModel::reduce_tensor_parallel(Tensor& tensor) const {
  if (groups_ != nullptr && groups_->config.tensor > 1) groups_->tensor->all_reduce_sum(tensor);
}

void BeamModel::sandwich_norm(bool fused, const Tensor& branch, Tensor& x, const Tensor& weight,
                              const Tensor* next_weight, Tensor& h) {
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  const auto scale = static_cast<float>(config_.residual_scale);
  if (fused) {
    Tensor none;
    groups_->fused_norm->add_rms_norm(x, weight, eps, scale, next_weight != nullptr ? *next_weight : none,
                                      next_weight != nullptr ? h : none);
  } else if (next_weight != nullptr) {
    backend_.add_rms_norm_then_norm(x, branch, weight, eps, scale, *next_weight, h);
  } else {
    backend_.add_rms_norm(x, branch, weight, eps, scale);
  }
}

void BeamModel::enable_lora(int32_t max_loras, int64_t max_rank) {
  require(groups_ == nullptr, "--enable-lora: LoRA on a distributed (TP/PP/EP) model is not implemented");
  require(max_loras >= 1 && max_rank >= 1, "--enable-lora: --max-loras {} and --max-lora-rank {} must be at least 1",
          max_loras, max_rank);
  max_loras_ = max_loras;
  max_lora_rank_ = max_rank;
  for (Layer& layer : layers_)
    if (!layer.moe) layer.lora.dense.experts = {layer.mlp};
}

LoraTensors& BeamModel::lora_tensors(Layer& layer, LoraProjection projection) {
  switch (projection) {
    case LoraProjection::Q: return layer.lora.q;
    case LoraProjection::K: return layer.lora.k;
    case LoraProjection::V: return layer.lora.v;
    case LoraProjection::O: return layer.lora.o;
    default: break;
  }
  fail("lora: {} is not an attention projection", lora_projection_name(projection));
}

std::shared_ptr<LoraTableStore>& BeamModel::lora_table(Layer& layer, LoraProjection projection) {
  switch (projection) {
    case LoraProjection::Gate: return layer.lora.gate;
    case LoraProjection::Up: return layer.lora.up;
    case LoraProjection::Down: return layer.lora.down;
    default: break;
  }
  fail("lora: {} is not an MLP projection", lora_projection_name(projection));
}

void BeamModel::load_lora(int32_t slot, const LoraWeights& adapter) {
  require(slot >= 0 && slot < max_loras_, "lora: slot {} outside the {} of --max-loras", slot, max_loras_);
  // The adapter's modules by (layer, projection), checked against the model.
  std::map<std::pair<int64_t, LoraProjection>, std::vector<const LoraModule*>> by_projection;
  for (const LoraModule& module : adapter.modules) {
    const std::string name = module.expert >= 0 ? fmt::format("layer {} expert {} {}", module.layer, module.expert,
                                                              lora_projection_name(module.projection))
                                                : fmt::format("layer {} {}", module.layer,
                                                              lora_projection_name(module.projection));
    require(module.layer >= 0 && module.layer < static_cast<int64_t>(layers_.size()), "lora: {}: no such layer", name);
    const Layer& layer = layers_[static_cast<std::size_t>(module.layer)];
    const bool mlp = module.projection >= LoraProjection::Gate;
    require(module.expert < 0 || (mlp && layer.moe &&
                                  module.expert < static_cast<int64_t>(layer.experts.experts.size())),
            "lora: {}: the layer has no such expert", name);
    require(!mlp || layer.moe == (module.expert >= 0), "lora: {}: the layer's MLP is {}", name,
            layer.moe ? "routed experts" : "dense");
    require(module.rank >= 1 && module.rank <= max_lora_rank_, "lora: {}: rank {} above --max-lora-rank {}", name,
            module.rank, max_lora_rank_);
    require(static_cast<int64_t>(module.a.size()) == module.rank * module.in &&
                static_cast<int64_t>(module.b.size()) == module.out * module.rank,
            "lora: {}: A holds {} values and B {}, for rank {}, in {}, out {}", name, module.a.size(), module.b.size(),
            module.rank, module.in, module.out);
    by_projection[{module.layer, module.projection}].push_back(&module);
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = layers_[i];
    for (LoraProjection projection : kLoraProjections) {
      const auto found = by_projection.find({static_cast<int64_t>(i), projection});
      const std::vector<const LoraModule*>* modules = found == by_projection.end() ? nullptr : &found->second;
      if (projection >= LoraProjection::Gate)
        load_mlp_lora(slot, layer, projection, modules);
      else
        load_attention_lora(slot, layer, projection, modules);
    }
  }
}

void BeamModel::load_attention_lora(int32_t slot, Layer& layer, LoraProjection projection,
                                    const std::vector<const LoraModule*>* modules) {
  const int64_t max_rank = max_lora_rank_;
  LoraTensors& tensors = lora_tensors(layer, projection);
  if (!tensors.defined()) {
    if (modules == nullptr) return;
    const LoraModule& first = *modules->front();
    tensors.a = backend_.alloc(DType::F32, {max_loras_, max_rank, first.in});
    tensors.b = backend_.alloc(DType::F32, {max_loras_, first.out, max_rank});
    backend_.fill_zero(tensors.a);
    backend_.fill_zero(tensors.b);
  }
  // The slot's block of every allocated projection is written, zeros where this adapter has no module, so that
  // nothing of the slot's previous adapter stays.
  const int64_t in = tensors.a.dim(2), out = tensors.b.dim(1);
  std::vector<float> a(static_cast<std::size_t>(max_rank * in), 0.0f);
  std::vector<float> b(static_cast<std::size_t>(out * max_rank), 0.0f);
  if (modules != nullptr) {
    const LoraModule& module = *modules->front();
    require(module.in == in && module.out == out, "lora: layer {} {}: [{}, {}] where the model has [{}, {}]",
            module.layer, lora_projection_name(projection), module.out, module.in, out, in);
    std::copy(module.a.begin(), module.a.end(), a.begin());
    for (int64_t o = 0; o < out; ++o)
      std::copy_n(module.b.begin() + o * module.rank, module.rank, b.begin() + o * max_rank);
  }
  Tensor a_block = tensors.a.view(slot * max_rank * in, {1, max_rank, in});
  Tensor b_block = tensors.b.view(slot * out * max_rank, {1, out, max_rank});
  backend_.copy_to(a_block, a.data());
  backend_.copy_to(b_block, b.data());
}

void BeamModel::load_mlp_lora(int32_t slot, Layer& layer, LoraProjection projection,
                              const std::vector<const LoraModule*>* modules) {
  std::shared_ptr<LoraTableStore>& store = lora_table(layer, projection);
  const MoeTensors& experts = layer.moe ? layer.experts : layer.lora.dense;
  const auto count = static_cast<int64_t>(experts.experts.size());
  if (store == nullptr) {
    if (modules == nullptr) return;
    const LoraModule& first = *modules->front();
    store = std::make_shared<LoraTableStore>(backend_, max_loras_, count, first.in, first.out);
    // A dense MLP's weights reach the backend as a one-expert MoE (moe_lora) the first time an adapter adapts it.
    if (!layer.moe && layer.lora.dense.packed == nullptr) backend_.prepare_moe(layer.lora.dense);
    // One token without an adapter through moe_lora: a backend that cannot apply LoRA to these experts (quantized
    // experts on cuda) says so at load, naming them, rather than in a step.
    SwigluLora probe;
    (projection == LoraProjection::Gate ? probe.gate : projection == LoraProjection::Up ? probe.up : probe.down) =
        store->table();
    probe.row_adapters = backend_.upload_i32(std::vector<int32_t>{-1}, {1});
    const int64_t hidden = config_.hidden_size;
    const Tensor h = backend_.upload_f32(std::vector<float>(static_cast<std::size_t>(hidden), 0.0f), {1, hidden});
    Tensor out = backend_.alloc(DType::F32, {1, hidden});
    backend_.moe_lora(h, backend_.upload_i32(std::vector<int32_t>{0}, {1, 1}),
                      backend_.upload_f32(std::vector<float>{1.0f}, {1, 1}), experts, probe, out);
  }
  // Every entry of the slot is rewritten (none where this adapter has no module): nothing of its previous adapter
  // stays.
  std::vector<const LoraModule*> by_expert(static_cast<std::size_t>(count), nullptr);
  if (modules != nullptr)
    for (const LoraModule* module : *modules) by_expert[static_cast<std::size_t>(std::max<int64_t>(module->expert, 0))] = module;
  store->load(slot, by_expert);
}

int64_t BeamModel::lora_bytes() const {
  int64_t total = 0;
  for (const Layer& layer : layers_) {
    for (const LoraTensors* tensors : {&layer.lora.q, &layer.lora.k, &layer.lora.v, &layer.lora.o})
      if (tensors->defined()) total += static_cast<int64_t>(tensors->a.nbytes() + tensors->b.nbytes());
    for (const LoraTableStore* store : {layer.lora.gate.get(), layer.lora.up.get(), layer.lora.down.get()})
      if (store != nullptr) total += store->bytes();
  }
  return total;
}

void BeamModel::apply_lora(const LoraTensors& lora, const Tensor& x, const StepInputs& inputs, Tensor& y) {
  if (inputs.any_lora && lora.defined()) backend_.lora(x, lora, inputs.row_adapters, y);
}

std::optional<SwigluLora> BeamModel::step_mlp_lora(const Layer& layer, const StepInputs& inputs) const {
  if (!inputs.any_lora || !layer.lora.mlp_defined()) return std::nullopt;
  SwigluLora lora;
  if (layer.lora.gate != nullptr) lora.gate = layer.lora.gate->table();
  if (layer.lora.up != nullptr) lora.up = layer.lora.up->table();
  if (layer.lora.down != nullptr) lora.down = layer.lora.down->table();
  lora.row_adapters = inputs.row_adapters;
  return lora;
}

void BeamModel::dense_mlp_lora(const Layer& layer, const Tensor& h, const SwigluLora& lora, Tensor& branch) {
  const int64_t rows = h.dim(0);
  // Made by the step that runs op by op before a graph records the same step (which must not upload): a power of two
  // of rows at least this step's, the earlier ones kept, since recorded graphs read them.
  if (dense_lora_routes_.empty() || dense_lora_routes_.back().expert.dim(0) < rows) {
    const auto capacity = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(rows)));
    const auto n = static_cast<std::size_t>(capacity);
    dense_lora_routes_.push_back({backend_.upload_i32(std::vector<int32_t>(n, 0), {capacity, 1}),
                                  backend_.upload_f32(std::vector<float>(n, 1.0f), {capacity, 1})});
  }
  const DenseLoraRoute& route = dense_lora_routes_.back();
  backend_.moe_lora(h, route.expert.view(0, {rows, 1}), route.weight.view(0, {rows, 1}), layer.lora.dense, lora,
                    branch);
}

}  // namespace beamline
