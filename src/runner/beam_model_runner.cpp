#include "runner/beam_model_runner.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "backend/registry.h"
#include "checkpoint/drafter_checkpoint.h"
#include "util/error.h"

namespace beamline {

BeamModelRunner::BeamModelRunner(const BeamWeights& weights, std::string_view device, const EngineConfig& config)
    : backend_(create_backend(device)) {
  config.validate();
  backend_->set_compute_dtype(parse_compute_dtype(config.dtype, backend_->device()));
  const DType kv_dtype = parse_kv_cache_dtype(config.kv_cache_dtype, backend_->compute_dtype());
  model_ = std::make_unique<BeamModel>(weights, *backend_);
  const ModelConfig& model_config = model_->config();
  if (config.speculative.method == SpeculativeMethod::DFlash) {
    // Checked in full first, so that a drafter that does not fit is named as such.
    const DrafterCheckpoint drafter =
        load_drafter_checkpoint(config.speculative.model, model_config, config.speculative.num_speculative_tokens);
    fail("--speculative-config: the drafter {} fits this model ({} layers reading target layers [{}], blocks of {}), "
         "but the dflash drafter's forward pass is not implemented yet; use \"ngram\" or \"none\"",
         config.speculative.model, drafter.config.num_hidden_layers, fmt::join(drafter.config.target_layer_ids, ", "),
         drafter.config.block_size);
  }
  const int32_t block_size = config.block_size > 0 ? config.block_size : default_block_size(model_config);

  // The size of one block, measured on a one-block pool rather than restating the storage layout here.
  bytes_per_block_ = static_cast<int64_t>(
      KvCache(*backend_, model_config, make_kv_cache_layout(model_config, block_size, 1), kv_dtype).bytes());
  int64_t budget = 0;
  if (backend_->device() == Device::Cpu) {
    budget = kv_cache_budget_bytes(config, kCpuKvCacheDefaultBytes, 0);
  } else {
    const std::optional<Backend::MemoryInfo> memory = backend_->memory_info();
    require(config.kv_cache_memory_bytes > 0 || memory.has_value(),
            "--kv-cache-memory is needed on the {} backend (it does not report its memory)", backend_->name());
    // What the weights and the backend hold now, plus headroom for a step's activations and GEMM workspaces.
    const int64_t used = memory ? memory->used_bytes + kDeviceActivationHeadroomBytes : 0;
    budget = kv_cache_budget_bytes(config, memory ? memory->total_bytes : 0, used);
  }
  const int64_t num_blocks = budget / bytes_per_block_;
  require(num_blocks >= 1 && num_blocks <= INT32_MAX,
          "a KV budget of {} bytes gives {} blocks of {} bytes; set --kv-cache-memory or --gpu-memory-utilization",
          budget, num_blocks, bytes_per_block_);
  cache_ = std::make_unique<KvCache>(*backend_, model_config,
                                     make_kv_cache_layout(model_config, block_size, static_cast<int32_t>(num_blocks)),
                                     kv_dtype);
  spdlog::info("KV budget {:.1f} MiB: {} blocks of {} tokens x {} layer slots ({} bytes each, {}) on {}; compute {}",
               static_cast<double>(budget) / (1 << 20), num_blocks, block_size, cache_->layout().slots_per_block,
               bytes_per_block_, dtype_name(kv_dtype), backend_->name(),
               backend_->compute_dtype() == ComputeDType::Float32 ? "float32" : "bfloat16");
  if (backend_->supports_graphs() && !config.enforce_eager) {
    graphs_ = std::make_unique<DecodeGraphs>(*model_, *cache_, config.max_num_seqs);
    spdlog::info("decode steps of up to {} sequences replay recorded graphs (--enforce-eager to run them op by op)",
                 std::min(config.max_num_seqs, DecodeGraphs::kMaxBucket));
  }
  sampler_ = std::make_unique<StepSampler>(*backend_, vocab_size());
}

std::unique_ptr<ModelStep> BeamModelRunner::launch(const ForwardBatch& batch) {
  const Tensor token_source = batch.deferred_tokens.empty() ? Tensor() : sampler_->deferred_source();
  return sampler_->step(forward(batch, token_source), batch.logit_rows.size());
}

Tensor BeamModelRunner::forward(const ForwardBatch& batch, const Tensor& token_source) {
  if (batch.logit_rows.empty() && !batch.tokens.empty()) {
    // A step of prompt chunks only wants no logits, but BeamModel::forward requires at least one row:
    // ask for one and drop it.
    ForwardBatch with_row = batch;
    with_row.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()) - 1);
    model_->forward(with_row, *cache_, token_source);
    return {};
  }
  if (graphs_) {
    model_->validate(batch, *cache_, token_source);
    if (std::optional<Tensor> logits = graphs_->forward(batch, token_source)) return *logits;
    return model_->forward_validated(batch, *cache_, token_source);
  }
  return model_->forward(batch, *cache_, token_source);
}

}  // namespace beamline
