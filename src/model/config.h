#pragma once
// config.json of a Beam checkpoint (docs/model-format.md §2), parsed and validated.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace beamline {

enum class LayerType { Sliding, Full };  // "sliding_attention" (RoPE, windowed) / "full_attention" (NoPE, SSMax)

struct QuantizationConfig {
  std::string quant_method;                  // "fp8", "mxfp8", "modelopt"
  std::string quant_algo;                    // "NVFP4" for modelopt
  std::vector<int64_t> weight_block_size;    // fp8: [128, 128]
  std::vector<std::string> ignored_layers;   // tensor-name prefixes left unquantized
};

struct ModelConfig {
  std::vector<std::string> architectures;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "sigmoid";
  std::string topk_method = "noaux_tc";
  std::vector<LayerType> layer_types;
  int64_t sliding_window = 0;
  double rope_theta = 10000.0;
  double ssmax_base = 2048.0;
  double ssmax_exponent = 0.1;
  double rms_norm_eps = 1e-6;
  double residual_scale = 0.0;               // default 1/sqrt(2*num_hidden_layers)
  double final_logit_softcapping = 30.0;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_ids;        // int or list in the file
  std::optional<QuantizationConfig> quantization;

  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  int64_t kv_group_size() const { return num_attention_heads / num_key_value_heads; }

  // Throws beamline::Error naming the key and the reason; `source` (a path) prefixes messages.
  static ModelConfig from_json(const nlohmann::json& json, const std::string& source = "config.json");
  static ModelConfig load(const std::filesystem::path& path);
  nlohmann::json to_json() const;
};

// The layer_types used when config.json has none: "full_attention" at i % global_attention_every ==
// global_attention_every - 1 and at the last layer, "sliding_attention" elsewhere (docs/model-format.md §2).
std::vector<LayerType> default_layer_types(int64_t num_hidden_layers, int64_t global_attention_every = 6);
double default_residual_scale(int64_t num_hidden_layers);  // 1/sqrt(2*num_hidden_layers)
std::string_view layer_type_name(LayerType type);           // "sliding_attention" / "full_attention"

}  // namespace beamline
