#pragma once
// The Beam forward pass (MODEL_FORMAT.md section 4), written once against the Backend op set.
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace beamline {

// The router settings of a config's MoE layers, as the backend's route op takes them.
RouterParams router_params(const ModelConfig& config);

class BeamModel {
 public:
  // Hands every weight to the backend once (load_weight / prepare_moe). Keeps a copy of `weights` (and so its
  // mappings) alive; `backend` must outlive the model.
  BeamModel(const BeamWeights& weights, Backend& backend);

  const ModelConfig& config() const { return weights_.config; }
  Backend& backend() const { return backend_; }

  // One step over a varlen batch: writes the K/V of every new token into `cache` (through the batch's block
  // tables), attends over the cache, and returns the soft-capped logits of batch.logit_rows as an F32 tensor
  // [logit_rows.size(), vocab_size] on the backend. Validates the batch (token ids, row ranges, block table
  // coverage) and throws beamline::Error naming the field.
  Tensor forward(const ForwardBatch& batch, KvCache& cache);

 private:
  struct Layer {
    Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    LinearTensors q, k, v, o;
    bool sliding = false;
    bool moe = false;
    SwigluTensors mlp;  // dense layers
    MoeTensors experts; // MoE layers
  };

  void validate(const ForwardBatch& batch, const KvCache& cache) const;

  BeamWeights weights_;
  Backend& backend_;
  Tensor embed_tokens_, final_norm_;
  LinearTensors lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace beamline
