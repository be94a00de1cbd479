#include "model/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "util/error.h"
#include "util/json_fields.h"

namespace beamline {
namespace {

using nlohmann::json;
namespace jf = json_fields;

QuantizationConfig parse_quantization(const json& value, const jf::Location& at) {
  jf::expect_object(value, at);
  QuantizationConfig quant;
  quant.quant_method = jf::required_string(value, "quant_method", at);
  if (quant.quant_method == "fp8") {
    const json* block = jf::find(value, "weight_block_size");
    quant.weight_block_size =
        block ? jf::integer_or_integers(*block, at.key("weight_block_size")) : std::vector<int64_t>{128, 128};
    // Every backend implements DeepSeek-V3's 128x128 blocks (and the activations' 1x128 groups that go with them).
    if (quant.weight_block_size != std::vector<int64_t>{128, 128})
      jf::fail_at(at.key("weight_block_size"),
                  fmt::format("must be [128, 128] (the block size beamline computes with), found {}",
                              block ? block->dump() : "[]"));
  } else if (quant.quant_method == "modelopt") {
    quant.quant_algo = jf::required_string(value, "quant_algo", at);
    if (quant.quant_algo != "NVFP4")
      jf::fail_at(at.key("quant_algo"), fmt::format("\"{}\" is not supported (only \"NVFP4\")", quant.quant_algo));
  } else if (quant.quant_method != "mxfp8") {
    jf::fail_at(at.key("quant_method"),
                fmt::format("\"{}\" is not one of \"fp8\", \"mxfp8\", \"modelopt\"", quant.quant_method));
  }
  if (quant.quant_method != "modelopt") quant.quant_algo = jf::optional_string(value, "quant_algo", at).value_or("");
  // fp8's ignored_layers, Hugging Face's modules_to_not_convert, ModelOpt's exclude_modules: the same prefixes.
  for (const char* key : {"ignored_layers", "modules_to_not_convert", "exclude_modules"})
    for (auto& prefix : jf::optional_string_array(value, key, at)) quant.ignored_layers.push_back(std::move(prefix));
  return quant;
}

std::vector<LayerType> parse_layer_types(const json& value, const jf::Location& at, int64_t num_layers) {
  const std::vector<std::string> names = jf::string_array(value, at);
  if (static_cast<int64_t>(names.size()) != num_layers)
    jf::fail_at(at, fmt::format("has {} entries but num_hidden_layers is {}", names.size(), num_layers));
  std::vector<LayerType> types;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == layer_type_name(LayerType::Sliding)) types.push_back(LayerType::Sliding);
    else if (names[i] == layer_type_name(LayerType::Full)) types.push_back(LayerType::Full);
    else jf::fail_at(at.index(i), fmt::format("\"{}\" is not \"sliding_attention\" or \"full_attention\"", names[i]));
  }
  return types;
}

}  // namespace

std::vector<LayerType> default_layer_types(int64_t num_hidden_layers, int64_t global_attention_every) {
  std::vector<LayerType> types(static_cast<std::size_t>(std::max<int64_t>(num_hidden_layers, 0)), LayerType::Sliding);
  for (int64_t i = 0; i < num_hidden_layers; ++i)
    if (i % global_attention_every == global_attention_every - 1 || i == num_hidden_layers - 1)
      types[static_cast<std::size_t>(i)] = LayerType::Full;
  return types;
}

double default_residual_scale(int64_t num_hidden_layers) {
  return 1.0 / std::sqrt(2.0 * static_cast<double>(num_hidden_layers));
}

std::string_view layer_type_name(LayerType type) {
  return type == LayerType::Sliding ? "sliding_attention" : "full_attention";
}

ModelConfig ModelConfig::from_json(const nlohmann::json& document, const std::string& source) {
  const jf::Location at(source, "");
  jf::expect_object(document, at);
  const auto fail_at = [&](std::string_view key, std::string_view reason) { jf::fail_at(at.key(key), reason); };
  const auto integer = [&](std::string_view key) { return jf::required_integer(document, key, at); };
  const auto number = [&](std::string_view key) { return jf::required_number(document, key, at); };
  const auto positive = [&](std::string_view key, int64_t value) {
    if (value <= 0) fail_at(key, fmt::format("must be positive, found {}", value));
    return value;
  };
  const auto positive_number = [&](std::string_view key, double value) {
    if (!(value > 0)) fail_at(key, fmt::format("must be positive, found {}", value));
    return value;
  };

  ModelConfig c;
  c.architectures = jf::optional_string_array(document, "architectures", at);
  c.model_type = jf::required_string(document, "model_type", at);
  if (c.model_type != "beam") fail_at("model_type", fmt::format("\"{}\" is not \"beam\"", c.model_type));
  c.vocab_size = positive("vocab_size", integer("vocab_size"));
  if (c.vocab_size > INT32_MAX) fail_at("vocab_size", fmt::format("{} does not fit 32-bit token ids", c.vocab_size));
  c.hidden_size = positive("hidden_size", integer("hidden_size"));
  c.num_hidden_layers = positive("num_hidden_layers", integer("num_hidden_layers"));
  // Far above any real model (Beam-1.0 has 52), and small enough that the per-layer tables stay bytes, not gigabytes.
  constexpr int64_t kMaxLayers = 1 << 16;
  if (c.num_hidden_layers > kMaxLayers)
    fail_at("num_hidden_layers", fmt::format("{} is more than the {} layers beamline allows", c.num_hidden_layers,
                                             kMaxLayers));
  c.num_attention_heads = positive("num_attention_heads", integer("num_attention_heads"));
  c.num_key_value_heads = positive("num_key_value_heads", integer("num_key_value_heads"));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail_at("num_key_value_heads", fmt::format("{} does not divide num_attention_heads ({})",
                                                      c.num_key_value_heads, c.num_attention_heads));
  c.head_dim = positive("head_dim", integer("head_dim"));
  c.intermediate_size = positive("intermediate_size", integer("intermediate_size"));
  c.moe_intermediate_size = positive("moe_intermediate_size", integer("moe_intermediate_size"));
  c.first_k_dense_replace = integer("first_k_dense_replace");
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_hidden_layers)
    fail_at("first_k_dense_replace", fmt::format("{} is outside [0, num_hidden_layers = {}]",
                                                        c.first_k_dense_replace, c.num_hidden_layers));

  c.n_routed_experts = positive("n_routed_experts", integer("n_routed_experts"));
  c.n_group = positive("n_group", integer("n_group"));
  if (c.n_routed_experts % c.n_group != 0)
    fail_at("n_group", fmt::format("{} does not divide n_routed_experts ({})", c.n_group, c.n_routed_experts));
  const int64_t experts_per_group = c.n_routed_experts / c.n_group;
  if (experts_per_group < 2)
    fail_at("n_group", fmt::format("{} groups of {} experts: the group score sums each group's 2 best "
                                          "experts, so a group needs at least 2", c.n_group, experts_per_group));
  c.topk_group = positive("topk_group", integer("topk_group"));
  if (c.topk_group > c.n_group)
    fail_at("topk_group", fmt::format("{} is larger than n_group ({})", c.topk_group, c.n_group));
  c.num_experts_per_tok = positive("num_experts_per_tok", integer("num_experts_per_tok"));
  if (c.num_experts_per_tok > c.topk_group * experts_per_group)
    fail_at("num_experts_per_tok",
                   fmt::format("{} is more than the {} experts in topk_group ({}) groups of {}", c.num_experts_per_tok,
                               c.topk_group * experts_per_group, c.topk_group, experts_per_group));
  c.norm_topk_prob = jf::optional_bool(document, "norm_topk_prob", at).value_or(true);
  c.routed_scaling_factor = positive_number("routed_scaling_factor", number("routed_scaling_factor"));
  c.scoring_func = jf::optional_string(document, "scoring_func", at).value_or("sigmoid");
  if (c.scoring_func != "sigmoid")
    fail_at("scoring_func", fmt::format("\"{}\" is not supported (only \"sigmoid\")", c.scoring_func));
  c.topk_method = jf::optional_string(document, "topk_method", at).value_or("noaux_tc");
  if (c.topk_method != "noaux_tc")
    fail_at("topk_method", fmt::format("\"{}\" is not supported (only \"noaux_tc\")", c.topk_method));

  if (const json* types = jf::find(document, "layer_types")) {
    c.layer_types = parse_layer_types(*types, at.key("layer_types"), c.num_hidden_layers);
  } else {
    const int64_t every =
        positive("global_attention_every", jf::optional_integer(document, "global_attention_every", at).value_or(6));
    c.layer_types = default_layer_types(c.num_hidden_layers, every);
  }
  const bool has_sliding = std::find(c.layer_types.begin(), c.layer_types.end(), LayerType::Sliding) != c.layer_types.end();
  if (has_sliding && c.head_dim % 2 != 0)
    fail_at("head_dim", fmt::format("{} is odd, but rotary embedding on the sliding layers pairs dimension j "
                                           "with j + head_dim/2", c.head_dim));
  c.sliding_window = positive("sliding_window", integer("sliding_window"));
  c.rope_theta = positive_number("rope_theta", number("rope_theta"));
  c.ssmax_base = positive_number("ssmax_base", jf::optional_number(document, "ssmax_base", at).value_or(2048.0));
  c.ssmax_exponent = jf::optional_number(document, "ssmax_exponent", at).value_or(0.1);
  c.rms_norm_eps = positive_number("rms_norm_eps", jf::optional_number(document, "rms_norm_eps", at).value_or(1e-6));
  c.residual_scale = positive_number("residual_scale", jf::optional_number(document, "residual_scale", at)
                                                           .value_or(default_residual_scale(c.num_hidden_layers)));
  c.final_logit_softcapping = positive_number(
      "final_logit_softcapping", jf::optional_number(document, "final_logit_softcapping", at).value_or(30.0));
  c.tie_word_embeddings = jf::optional_bool(document, "tie_word_embeddings", at).value_or(false);
  c.max_position_embeddings = positive("max_position_embeddings", integer("max_position_embeddings"));

  const auto token_id = [&](std::string_view key, int64_t id) {
    if (id < 0 || id >= c.vocab_size)
      fail_at(key, fmt::format("token id {} is outside the vocabulary [0, {})", id, c.vocab_size));
    return id;
  };
  if (auto id = jf::optional_integer(document, "bos_token_id", at)) c.bos_token_id = token_id("bos_token_id", *id);
  if (auto id = jf::optional_integer(document, "pad_token_id", at)) c.pad_token_id = token_id("pad_token_id", *id);
  if (const json* eos = jf::find(document, "eos_token_id")) {
    c.eos_token_ids = jf::integer_or_integers(*eos, at.key("eos_token_id"));
    for (std::size_t i = 0; i < c.eos_token_ids.size(); ++i)
      token_id(eos->is_array() ? fmt::format("eos_token_id[{}]", i) : std::string("eos_token_id"), c.eos_token_ids[i]);
  }
  if (const json* quant = jf::find(document, "quantization_config"))
    c.quantization = parse_quantization(*quant, at.key("quantization_config"));
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  json parsed;
  try {
    parsed = json::parse(in);
  } catch (const json::exception& error) {
    fail("{}: invalid JSON: {}", path.string(), error.what());
  }
  return from_json(parsed, path.string());
}

nlohmann::json ModelConfig::to_json() const {
  json out = json::object();
  out["architectures"] = architectures;
  out["model_type"] = model_type;
  out["vocab_size"] = vocab_size;
  out["hidden_size"] = hidden_size;
  out["num_hidden_layers"] = num_hidden_layers;
  out["num_attention_heads"] = num_attention_heads;
  out["num_key_value_heads"] = num_key_value_heads;
  out["head_dim"] = head_dim;
  out["intermediate_size"] = intermediate_size;
  out["moe_intermediate_size"] = moe_intermediate_size;
  out["first_k_dense_replace"] = first_k_dense_replace;
  out["n_routed_experts"] = n_routed_experts;
  out["num_experts_per_tok"] = num_experts_per_tok;
  out["n_group"] = n_group;
  out["topk_group"] = topk_group;
  out["norm_topk_prob"] = norm_topk_prob;
  out["routed_scaling_factor"] = routed_scaling_factor;
  out["scoring_func"] = scoring_func;
  out["topk_method"] = topk_method;
  json types = json::array();
  for (LayerType type : layer_types) types.push_back(layer_type_name(type));
  out["layer_types"] = std::move(types);
  out["sliding_window"] = sliding_window;
  out["rope_theta"] = rope_theta;
  out["ssmax_base"] = ssmax_base;
  out["ssmax_exponent"] = ssmax_exponent;
  out["rms_norm_eps"] = rms_norm_eps;
  out["residual_scale"] = residual_scale;
  out["final_logit_softcapping"] = final_logit_softcapping;
  out["tie_word_embeddings"] = tie_word_embeddings;
  out["max_position_embeddings"] = max_position_embeddings;
  out["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  out["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  if (eos_token_ids.size() == 1) out["eos_token_id"] = eos_token_ids.front();
  else if (!eos_token_ids.empty()) out["eos_token_id"] = eos_token_ids;
  if (quantization) {
    // The keys vLLM reads for each method: Fp8Config (DeepSeek-V3's checkpoints) and ModelOpt's NVFP4 export.
    json quant = {{"quant_method", quantization->quant_method}};
    if (!quantization->quant_algo.empty()) quant["quant_algo"] = quantization->quant_algo;
    if (quantization->quant_method == "fp8") {
      quant["activation_scheme"] = "dynamic";
      quant["fmt"] = "e4m3";
    }
    if (quantization->quant_method == "modelopt") quant["group_size"] = 16;
    if (!quantization->weight_block_size.empty()) quant["weight_block_size"] = quantization->weight_block_size;
    if (!quantization->ignored_layers.empty())
      quant[quantization->quant_method == "modelopt" ? "exclude_modules" : "ignored_layers"] =
          quantization->ignored_layers;
    out["quantization_config"] = std::move(quant);
  }
  return out;
}

}  // namespace beamline
