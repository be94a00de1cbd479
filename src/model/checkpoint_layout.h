#pragma once
// The tensor names and shapes a config implies (docs/model-format.md §3): one list shared by the loader
// (what must be in a checkpoint) and the writer (what make-model produces).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace beamline {

enum class TensorRole {
  Embedding,   // embed_tokens: BF16/F16/F32
  Norm,        // RMSNorm weights: BF16/F16/F32
  Projection,  // [out, in] linear weights: BF16/F16/F32 or a quantized layout (section 5)
  Router,      // mlp.gate.weight: F32 only
  RouterBias,  // mlp.gate.e_score_correction_bias: F32 only
};

struct ExpectedTensor {
  std::string name;
  TensorRole role;
  std::vector<int64_t> shape;
};

// In file order: embeddings, each layer (attention, then MLP or router and experts), final norm, LM head
// (absent when tie_word_embeddings).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

std::string layer_tensor_name(int64_t layer, std::string_view suffix);  // "model.layers.{layer}.{suffix}"
std::string expert_tensor_name(int64_t layer, int64_t expert, std::string_view projection);  // ...experts.{e}.{projection}.weight

}  // namespace beamline
