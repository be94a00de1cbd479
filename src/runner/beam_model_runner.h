#pragma once
// ModelRunner over BeamModel: loads a checkpoint on a backend, sizes the paged KV pool from the engine's
// memory flags (once, at start-up) and runs batched steps through it: the forward pass (a recorded decode graph where
// one fits) and sampling on the same backend (runner/step_sampler.h).
#include <filesystem>
#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "model/beam_model.h"
#include "model/weights.h"
#include "runner/decode_graphs.h"
#include "runner/kv_cache.h"
#include "runner/step_sampler.h"

namespace beamline {

class BeamModelRunner : public ModelRunner {
 public:
  // `device` is "cpu" or "cuda". The KV budget is --kv-cache-memory, or --gpu-memory-utilization of the
  // device (on the CPU backend: of kCpuKvCacheDefaultBytes); the pool gets as many blocks as fit.
  // `weights` come from a checkpoint or are random (dummy_weights, --load-format dummy). The compute and KV
  // dtypes are the config's --dtype and --kv-cache-dtype.
  BeamModelRunner(const BeamWeights& weights, std::string_view device, const EngineConfig& config);

  int32_t vocab_size() const override { return static_cast<int32_t>(model_->config().vocab_size); }
  const KvCacheLayout& kv_layout() const override { return cache_->layout(); }
  int32_t sliding_window() const override { return static_cast<int32_t>(model_->config().sliding_window); }
  int64_t max_position_embeddings() const override { return model_->config().max_position_embeddings; }
  int64_t kv_bytes_per_block() const override { return bytes_per_block_; }
  std::unique_ptr<ModelStep> launch(const ForwardBatch& batch) override;

  const ModelConfig& model_config() const { return model_->config(); }

 private:
  // The logits of batch.logit_rows (undefined when there are none); `token_source` feeds batch.deferred_tokens.
  Tensor forward(const ForwardBatch& batch, const Tensor& token_source);

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BeamModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null with --enforce-eager or a backend without graphs
  std::unique_ptr<StepSampler> sampler_;
  int64_t bytes_per_block_ = 0;
};

}  // namespace beamline
