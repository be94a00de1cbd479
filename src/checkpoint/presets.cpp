#include "checkpoint/presets.h"

#include <fmt/ranges.h>

#include <cmath>

#include "checkpoint/synthetic_tokenizer.h"
#include "util/error.h"

namespace beamline {
namespace {

struct Shape {
  int64_t vocab, hidden, layers, dense_layers, q_heads, kv_heads, head_dim, intermediate, experts, experts_per_token,
      groups, topk_groups, moe_intermediate, sliding_window, global_attention_every;
};

ModelConfig from_shape(const Shape& s) {
  ModelConfig c;
  c.architectures = {"BeamForCausalLM"};
  c.model_type = "beam";
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.q_heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.intermediate_size = s.intermediate;
  c.moe_intermediate_size = s.moe_intermediate;
  c.first_k_dense_replace = s.dense_layers;
  c.n_routed_experts = s.experts;
  c.num_experts_per_tok = s.experts_per_token;
  c.n_group = s.groups;
  c.topk_group = s.topk_groups;
  c.routed_scaling_factor = 2.5;
  c.layer_types = default_layer_types(s.layers, s.global_attention_every);
  c.sliding_window = s.sliding_window;
  c.rope_theta = 10000.0;
  c.residual_scale = default_residual_scale(s.layers);
  c.max_position_embeddings = 1048576;
  c.bos_token_id = harmony_special_token_id(s.vocab, "<|startoftext|>");
  c.pad_token_id = harmony_special_token_id(s.vocab, "<|endoftext|>");
  c.eos_token_ids = {harmony_special_token_id(s.vocab, "<|return|>"), harmony_special_token_id(s.vocab, "<|call|>"),
                     harmony_special_token_id(s.vocab, "<|endoftext|>")};
  return c;
}

// Full attention every 3rd layer in `tiny`, so a full layer sits between sliding ones and not only last.
constexpr Shape kTiny{512, 64, 6, 1, 4, 2, 16, 128, 8, 2, 4, 2, 32, 8, 3};
constexpr Shape kSmall{4096, 1024, 8, 2, 8, 2, 128, 2048, 32, 4, 4, 2, 256, 64, 6};
constexpr Shape kBeam10{201088, 5120, 52, 3, 48, 8, 128, 20480, 256, 8, 8, 4, 2560, 512, 6};

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "small", "beam-1.0"}; }

ModelConfig preset_config(std::string_view name) {
  if (name == "tiny") return from_shape(kTiny);
  if (name == "small") return from_shape(kSmall);
  if (name == "beam-1.0") return from_shape(kBeam10);
  fail("unknown preset \"{}\" (presets: {})", name, fmt::join(preset_names(), ", "));
}

ModelConfig with_num_layers(const ModelConfig& config, int64_t num_layers) {
  require(num_layers >= 1, "the number of layers must be at least 1, not {}", num_layers);
  ModelConfig out = config;
  const int64_t old_layers = config.num_hidden_layers;
  out.num_hidden_layers = num_layers;
  const bool has_moe = config.first_k_dense_replace < old_layers;
  out.first_k_dense_replace = has_moe ? std::min(config.first_k_dense_replace, num_layers - 1) : num_layers;

  out.layer_types.clear();
  for (int64_t every = 1; every <= old_layers && out.layer_types.empty(); ++every)
    if (config.layer_types == default_layer_types(old_layers, every)) out.layer_types = default_layer_types(num_layers, every);
  if (out.layer_types.empty()) {
    require(num_layers <= old_layers, "cannot extend the explicit layer_types of {} layers to {}", old_layers, num_layers);
    out.layer_types.assign(config.layer_types.begin(), config.layer_types.begin() + num_layers);
  }
  if (std::abs(config.residual_scale - default_residual_scale(old_layers)) < 1e-12)
    out.residual_scale = default_residual_scale(num_layers);
  return out;
}

}  // namespace beamline
