#include "model/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "util/error.h"

namespace beamline {
namespace {

using nlohmann::json;

// Reads typed keys out of one JSON object; every failure names the source, the key path and the reason.
class KeyReader {
 public:
  KeyReader(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {
    if (!object_.is_object()) fail_at("", fmt::format("must be a JSON object, found {}", object_.type_name()));
  }

  [[noreturn]] void fail_at(std::string_view key, std::string_view reason) const {
    if (key.empty() && prefix_.empty()) fail("{}: {}", source_, reason);
    if (key.empty()) fail("{}: key \"{}\": {}", source_, prefix_.substr(0, prefix_.size() - 1), reason);
    fail("{}: key \"{}{}\": {}", source_, prefix_, key, reason);
  }

  const json* find(std::string_view key) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const json& required(std::string_view key) const {
    const json* value = find(key);
    if (value == nullptr) fail_at(key, "required key is missing");
    return *value;
  }

  int64_t integer(std::string_view key, const json& value) const {
    if (!value.is_number_integer())
      fail_at(key, fmt::format("must be an integer, found {} {}", value.type_name(), value.dump()));
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail_at(key, fmt::format("{} is out of range", value.dump()));
    return value.get<int64_t>();
  }
  int64_t required_int(std::string_view key) const { return integer(key, required(key)); }
  int64_t optional_int(std::string_view key, int64_t fallback) const {
    const json* value = find(key);
    return value ? integer(key, *value) : fallback;
  }
  std::optional<int64_t> nullable_int(std::string_view key) const {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    return integer(key, *value);
  }

  double number(std::string_view key, const json& value) const {
    if (!value.is_number()) fail_at(key, fmt::format("must be a number, found {} {}", value.type_name(), value.dump()));
    const double result = value.get<double>();
    if (!std::isfinite(result)) fail_at(key, fmt::format("{} is not finite", value.dump()));
    return result;
  }
  double required_number(std::string_view key) const { return number(key, required(key)); }
  double optional_number(std::string_view key, double fallback) const {
    const json* value = find(key);
    return value ? number(key, *value) : fallback;
  }

  bool optional_bool(std::string_view key, bool fallback) const {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail_at(key, fmt::format("must be true or false, found {} {}", value->type_name(), value->dump()));
    return value->get<bool>();
  }

  std::string string(std::string_view key, const json& value) const {
    if (!value.is_string()) fail_at(key, fmt::format("must be a string, found {} {}", value.type_name(), value.dump()));
    return value.get<std::string>();
  }
  std::string required_string(std::string_view key) const { return string(key, required(key)); }
  std::string optional_string(std::string_view key, std::string fallback) const {
    const json* value = find(key);
    return value ? string(key, *value) : std::move(fallback);
  }

  std::vector<std::string> string_list(std::string_view key) const {
    std::vector<std::string> result;
    const json* value = find(key);
    if (value == nullptr) return result;
    if (!value->is_array()) fail_at(key, fmt::format("must be a list of strings, found {}", value->type_name()));
    for (std::size_t i = 0; i < value->size(); ++i)
      result.push_back(string(fmt::format("{}[{}]", key, i), (*value)[i]));
    return result;
  }

  std::vector<int64_t> int_list(std::string_view key, const json& value) const {
    std::vector<int64_t> result;
    if (value.is_array()) {
      for (std::size_t i = 0; i < value.size(); ++i) result.push_back(integer(fmt::format("{}[{}]", key, i), value[i]));
    } else if (value.is_number_integer()) {
      result.push_back(integer(key, value));
    } else {
      fail_at(key, fmt::format("must be an integer or a list of integers, found {} {}", value.type_name(), value.dump()));
    }
    return result;
  }

  const std::string& source() const { return source_; }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

QuantizationConfig parse_quantization(const json& value, const std::string& source) {
  const KeyReader reader(value, source, "quantization_config.");
  QuantizationConfig quant;
  quant.quant_method = reader.required_string("quant_method");
  if (quant.quant_method == "fp8") {
    const json* block = reader.find("weight_block_size");
    quant.weight_block_size = block ? reader.int_list("weight_block_size", *block) : std::vector<int64_t>{128, 128};
    if (quant.weight_block_size.size() != 2 || quant.weight_block_size[0] <= 0 || quant.weight_block_size[1] <= 0)
      reader.fail_at("weight_block_size", fmt::format("must be two positive integers [rows, columns], found {}",
                                                      block ? block->dump() : "[]"));
  } else if (quant.quant_method == "modelopt") {
    quant.quant_algo = reader.required_string("quant_algo");
    if (quant.quant_algo != "NVFP4")
      reader.fail_at("quant_algo", fmt::format("\"{}\" is not supported (only \"NVFP4\")", quant.quant_algo));
  } else if (quant.quant_method != "mxfp8") {
    reader.fail_at("quant_method",
                   fmt::format("\"{}\" is not one of \"fp8\", \"mxfp8\", \"modelopt\"", quant.quant_method));
  }
  if (quant.quant_method != "modelopt") quant.quant_algo = reader.optional_string("quant_algo", "");
  for (const char* key : {"ignored_layers", "modules_to_not_convert"})
    for (auto& prefix : reader.string_list(key)) quant.ignored_layers.push_back(std::move(prefix));
  return quant;
}

std::vector<LayerType> parse_layer_types(const KeyReader& reader, const json& value, int64_t num_layers) {
  if (!value.is_array()) reader.fail_at("layer_types", fmt::format("must be a list of strings, found {}", value.type_name()));
  if (static_cast<int64_t>(value.size()) != num_layers)
    reader.fail_at("layer_types",
                   fmt::format("has {} entries but num_hidden_layers is {}", value.size(), num_layers));
  std::vector<LayerType> types;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string key = fmt::format("layer_types[{}]", i);
    const std::string name = reader.string(key, value[i]);
    if (name == layer_type_name(LayerType::Sliding)) types.push_back(LayerType::Sliding);
    else if (name == layer_type_name(LayerType::Full)) types.push_back(LayerType::Full);
    else reader.fail_at(key, fmt::format("\"{}\" is not \"sliding_attention\" or \"full_attention\"", name));
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
  const KeyReader reader(document, source);
  const auto positive = [&](std::string_view key, int64_t value) {
    if (value <= 0) reader.fail_at(key, fmt::format("must be positive, found {}", value));
    return value;
  };
  const auto positive_number = [&](std::string_view key, double value) {
    if (!(value > 0)) reader.fail_at(key, fmt::format("must be positive, found {}", value));
    return value;
  };

  ModelConfig c;
  c.architectures = reader.string_list("architectures");
  c.model_type = reader.required_string("model_type");
  if (c.model_type != "beam") reader.fail_at("model_type", fmt::format("\"{}\" is not \"beam\"", c.model_type));
  c.vocab_size = positive("vocab_size", reader.required_int("vocab_size"));
  if (c.vocab_size > INT32_MAX) reader.fail_at("vocab_size", fmt::format("{} does not fit 32-bit token ids", c.vocab_size));
  c.hidden_size = positive("hidden_size", reader.required_int("hidden_size"));
  c.num_hidden_layers = positive("num_hidden_layers", reader.required_int("num_hidden_layers"));
  c.num_attention_heads = positive("num_attention_heads", reader.required_int("num_attention_heads"));
  c.num_key_value_heads = positive("num_key_value_heads", reader.required_int("num_key_value_heads"));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    reader.fail_at("num_key_value_heads", fmt::format("{} does not divide num_attention_heads ({})",
                                                      c.num_key_value_heads, c.num_attention_heads));
  c.head_dim = positive("head_dim", reader.required_int("head_dim"));
  c.intermediate_size = positive("intermediate_size", reader.required_int("intermediate_size"));
  c.moe_intermediate_size = positive("moe_intermediate_size", reader.required_int("moe_intermediate_size"));
  c.first_k_dense_replace = reader.required_int("first_k_dense_replace");
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_hidden_layers)
    reader.fail_at("first_k_dense_replace", fmt::format("{} is outside [0, num_hidden_layers = {}]",
                                                        c.first_k_dense_replace, c.num_hidden_layers));

  c.n_routed_experts = positive("n_routed_experts", reader.required_int("n_routed_experts"));
  c.n_group = positive("n_group", reader.required_int("n_group"));
  if (c.n_routed_experts % c.n_group != 0)
    reader.fail_at("n_group", fmt::format("{} does not divide n_routed_experts ({})", c.n_group, c.n_routed_experts));
  const int64_t experts_per_group = c.n_routed_experts / c.n_group;
  if (experts_per_group < 2)
    reader.fail_at("n_group", fmt::format("{} groups of {} experts: the group score sums each group's 2 best "
                                          "experts, so a group needs at least 2", c.n_group, experts_per_group));
  c.topk_group = positive("topk_group", reader.required_int("topk_group"));
  if (c.topk_group > c.n_group)
    reader.fail_at("topk_group", fmt::format("{} is larger than n_group ({})", c.topk_group, c.n_group));
  c.num_experts_per_tok = positive("num_experts_per_tok", reader.required_int("num_experts_per_tok"));
  if (c.num_experts_per_tok > c.topk_group * experts_per_group)
    reader.fail_at("num_experts_per_tok",
                   fmt::format("{} is more than the {} experts in topk_group ({}) groups of {}", c.num_experts_per_tok,
                               c.topk_group * experts_per_group, c.topk_group, experts_per_group));
  c.norm_topk_prob = reader.optional_bool("norm_topk_prob", true);
  c.routed_scaling_factor = positive_number("routed_scaling_factor", reader.required_number("routed_scaling_factor"));
  c.scoring_func = reader.optional_string("scoring_func", "sigmoid");
  if (c.scoring_func != "sigmoid")
    reader.fail_at("scoring_func", fmt::format("\"{}\" is not supported (only \"sigmoid\")", c.scoring_func));
  c.topk_method = reader.optional_string("topk_method", "noaux_tc");
  if (c.topk_method != "noaux_tc")
    reader.fail_at("topk_method", fmt::format("\"{}\" is not supported (only \"noaux_tc\")", c.topk_method));

  if (const json* types = reader.find("layer_types")) {
    c.layer_types = parse_layer_types(reader, *types, c.num_hidden_layers);
  } else {
    const int64_t every = positive("global_attention_every", reader.optional_int("global_attention_every", 6));
    c.layer_types = default_layer_types(c.num_hidden_layers, every);
  }
  const bool has_sliding = std::find(c.layer_types.begin(), c.layer_types.end(), LayerType::Sliding) != c.layer_types.end();
  if (has_sliding && c.head_dim % 2 != 0)
    reader.fail_at("head_dim", fmt::format("{} is odd, but rotary embedding on the sliding layers pairs dimension j "
                                           "with j + head_dim/2", c.head_dim));
  c.sliding_window = positive("sliding_window", reader.required_int("sliding_window"));
  c.rope_theta = positive_number("rope_theta", reader.required_number("rope_theta"));
  c.ssmax_base = positive_number("ssmax_base", reader.optional_number("ssmax_base", 2048.0));
  c.ssmax_exponent = reader.optional_number("ssmax_exponent", 0.1);
  c.rms_norm_eps = positive_number("rms_norm_eps", reader.optional_number("rms_norm_eps", 1e-6));
  c.residual_scale = positive_number("residual_scale", reader.optional_number("residual_scale",
                                                                              default_residual_scale(c.num_hidden_layers)));
  c.final_logit_softcapping = positive_number("final_logit_softcapping", reader.optional_number("final_logit_softcapping", 30.0));
  c.tie_word_embeddings = reader.optional_bool("tie_word_embeddings", false);
  c.max_position_embeddings = positive("max_position_embeddings", reader.required_int("max_position_embeddings"));

  const auto token_id = [&](std::string_view key, int64_t id) {
    if (id < 0 || id >= c.vocab_size)
      reader.fail_at(key, fmt::format("token id {} is outside the vocabulary [0, {})", id, c.vocab_size));
    return id;
  };
  if (auto id = reader.nullable_int("bos_token_id")) c.bos_token_id = token_id("bos_token_id", *id);
  if (auto id = reader.nullable_int("pad_token_id")) c.pad_token_id = token_id("pad_token_id", *id);
  if (const json* eos = reader.find("eos_token_id")) {
    c.eos_token_ids = reader.int_list("eos_token_id", *eos);
    for (std::size_t i = 0; i < c.eos_token_ids.size(); ++i)
      token_id(eos->is_array() ? fmt::format("eos_token_id[{}]", i) : std::string("eos_token_id"), c.eos_token_ids[i]);
  }
  if (const json* quant = reader.find("quantization_config")) c.quantization = parse_quantization(*quant, source);
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  json parsed;
  try {
    parsed = json::parse(in);
  } catch (const json::parse_error& error) {
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
    json quant = {{"quant_method", quantization->quant_method}};
    if (!quantization->quant_algo.empty()) quant["quant_algo"] = quantization->quant_algo;
    if (!quantization->weight_block_size.empty()) quant["weight_block_size"] = quantization->weight_block_size;
    if (!quantization->ignored_layers.empty()) quant["ignored_layers"] = quantization->ignored_layers;
    out["quantization_config"] = std::move(quant);
  }
  return out;
}

}  // namespace beamline
