#include "model/checkpoint_layout.h"

#include <fmt/format.h>

namespace beamline {

std::string layer_tensor_name(int64_t layer, std::string_view suffix) {
  return fmt::format("model.layers.{}.{}", layer, suffix);
}

std::string expert_tensor_name(int64_t layer, int64_t expert, std::string_view projection) {
  return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, projection);
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, V = c.vocab_size, D = c.head_dim;
  const int64_t q_width = c.num_attention_heads * D, kv_width = c.num_key_value_heads * D;
  std::vector<ExpectedTensor> tensors;
  tensors.push_back({"model.embed_tokens.weight", TensorRole::Embedding, {V, H}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto add = [&](std::string_view suffix, TensorRole role, std::vector<int64_t> shape) {
      tensors.push_back({layer_tensor_name(i, suffix), role, std::move(shape)});
    };
    add("input_layernorm.weight", TensorRole::Norm, {H});
    add("self_attn.q_proj.weight", TensorRole::Projection, {q_width, H});
    add("self_attn.k_proj.weight", TensorRole::Projection, {kv_width, H});
    add("self_attn.v_proj.weight", TensorRole::Projection, {kv_width, H});
    add("self_attn.o_proj.weight", TensorRole::Projection, {H, q_width});
    add("post_attention_layernorm.weight", TensorRole::Norm, {H});
    add("pre_feedforward_layernorm.weight", TensorRole::Norm, {H});
    add("post_feedforward_layernorm.weight", TensorRole::Norm, {H});
    if (!c.is_moe_layer(i)) {
      const int64_t F = c.intermediate_size;
      add("mlp.gate_proj.weight", TensorRole::Projection, {F, H});
      add("mlp.up_proj.weight", TensorRole::Projection, {F, H});
      add("mlp.down_proj.weight", TensorRole::Projection, {H, F});
      continue;
    }
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
    add("mlp.gate.weight", TensorRole::Router, {E, H});
    add("mlp.gate.e_score_correction_bias", TensorRole::RouterBias, {E});
    for (int64_t e = 0; e < E; ++e) {
      tensors.push_back({expert_tensor_name(i, e, "gate_proj"), TensorRole::Projection, {I, H}});
      tensors.push_back({expert_tensor_name(i, e, "up_proj"), TensorRole::Projection, {I, H}});
      tensors.push_back({expert_tensor_name(i, e, "down_proj"), TensorRole::Projection, {H, I}});
    }
  }
  tensors.push_back({"model.norm.weight", TensorRole::Norm, {H}});
  if (!c.tie_word_embeddings) tensors.push_back({"lm_head.weight", TensorRole::Projection, {V, H}});
  return tensors;
}

}  // namespace beamline
