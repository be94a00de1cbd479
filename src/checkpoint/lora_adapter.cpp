#include "checkpoint/lora_adapter.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>

#include "checkpoint/safetensors.h"
#include "model/checkpoint_layout.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace beamline {
namespace {

namespace jf = json_fields;

constexpr std::string_view kConfigFile = "adapter_config.json";
constexpr std::string_view kWeightsFile = "adapter_model.safetensors";
constexpr std::string_view kPeftPrefix = "base_model.model.";

// A rank_pattern or alpha_pattern entry: PEFT's key, matched against a module's path as re.match(rf"(.*\.)?({key})$").
template <typename T>
struct PatternEntry {
  std::string key;
  std::regex regex;
  T value;
};

struct AdapterConfig {
  int64_t rank = 0;
  double alpha = 0.0;
  bool rslora = false;
  std::set<std::string, std::less<>> targets;  // PEFT module names (q_proj ..)
  std::vector<PatternEntry<int64_t>> rank_pattern;
  std::vector<PatternEntry<double>> alpha_pattern;
};

// The value of the patterns that match `module`, nullopt when none does. nlohmann's objects forget PEFT's key order
// (PEFT takes the first matching key), so two matching keys that disagree are refused rather than guessed between.
template <typename T>
std::optional<T> pattern_value(const std::vector<PatternEntry<T>>& patterns, const std::string& module,
                               const std::filesystem::path& config_file, std::string_view what) {
  const PatternEntry<T>* chosen = nullptr;
  for (const PatternEntry<T>& entry : patterns) {
    if (!std::regex_match(module, entry.regex)) continue;
    if (chosen != nullptr && chosen->value != entry.value)
      fail("{}: key \"{}\": module \"{}\" matches both \"{}\" ({}) and \"{}\" ({})", config_file.string(), what, module,
           chosen->key, chosen->value, entry.key, entry.value);
    chosen = &entry;
  }
  if (chosen == nullptr) return std::nullopt;
  return chosen->value;
}

// rank_pattern / alpha_pattern: {PEFT key: value}; absent, null or {} for none.
template <typename T, typename Read>
std::vector<PatternEntry<T>> read_pattern(const nlohmann::json& json, std::string_view key, const jf::Location& root,
                                          Read read) {
  std::vector<PatternEntry<T>> patterns;
  const nlohmann::json* object = jf::find(json, key);
  if (object == nullptr) return patterns;
  jf::expect_object(*object, root.key(key));
  for (const auto& [pattern, value] : object->items()) {
    const jf::Location where = root.key(key).key(pattern);
    try {
      patterns.push_back({pattern, std::regex("(.*\\.)?(" + pattern + ")"), read(value, where)});
    } catch (const std::regex_error& error) {
      jf::fail_at(where, fmt::format("is not a regular expression this reader takes: {}", error.what()));
    }
  }
  return patterns;
}

double module_scale(const AdapterConfig& config, int64_t rank, double alpha) {
  return config.rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& error) {
    fail("{}: invalid JSON: {}", path.string(), error.what());
  }
}

// A key this reader does not apply must be absent, null, false, "none" or empty: refusing beats serving other math.
void require_unused(const nlohmann::json& json, std::string_view key, const jf::Location& root, std::string_view why) {
  const nlohmann::json* value = jf::find(json, key);
  if (value == nullptr || value->is_null() || (value->is_boolean() && !value->get<bool>()) ||
      (value->is_string() && value->get<std::string>() == "none") ||
      ((value->is_object() || value->is_array()) && value->empty()))
    return;
  jf::fail_at(root.key(key), fmt::format("{} is not supported ({})", value->dump(), why));
}

AdapterConfig read_config(const std::filesystem::path& dir, int64_t max_lora_rank) {
  const std::filesystem::path path = dir / kConfigFile;
  const nlohmann::json json = read_json(path);
  const jf::Location root(path.string(), "");
  jf::expect_object(json, root);
  if (const std::optional<std::string> type = jf::optional_string(json, "peft_type", root); type && *type != "LORA")
    jf::fail_at(root.key("peft_type"), fmt::format("\"{}\" is not a LoRA adapter (expected \"LORA\")", *type));
  AdapterConfig config;
  config.rank = jf::required_integer(json, "r", root);
  if (config.rank < 1) jf::fail_at(root.key("r"), fmt::format("must be at least 1 (got {})", config.rank));
  if (config.rank > max_lora_rank)
    jf::fail_at(root.key("r"), fmt::format("rank {} exceeds --max-lora-rank {}", config.rank, max_lora_rank));
  config.alpha = jf::required_number(json, "lora_alpha", root);
  config.rslora = jf::optional_bool(json, "use_rslora", root).value_or(false);
  config.rank_pattern = read_pattern<int64_t>(json, "rank_pattern", root, [&](const nlohmann::json& value,
                                                                              const jf::Location& where) {
    const int64_t rank = jf::as_integer(value, where);
    if (rank < 1) jf::fail_at(where, fmt::format("must be at least 1 (got {})", rank));
    if (rank > max_lora_rank) jf::fail_at(where, fmt::format("rank {} exceeds --max-lora-rank {}", rank, max_lora_rank));
    return rank;
  });
  config.alpha_pattern = read_pattern<double>(
      json, "alpha_pattern", root, [](const nlohmann::json& value, const jf::Location& where) {
        return jf::as_number(value, where);
      });
  require_unused(json, "bias", root, "LoRA biases are not applied");
  require_unused(json, "use_dora", root, "DoRA is not applied");
  require_unused(json, "modules_to_save", root, "only LoRA deltas are applied");
  require_unused(json, "fan_in_fan_out", root, "lora_A is [r, in] and lora_B [out, r]");
  const nlohmann::json& targets = jf::required(json, "target_modules", root);
  std::vector<std::string> names;
  if (targets.is_string()) {
    if (targets.get<std::string>() != "all-linear")
      jf::fail_at(root.key("target_modules"), "a regular expression is not supported: list the module names");
    for (LoraProjection projection : kLoraProjections) names.emplace_back(lora_projection_name(projection));
  } else {
    names = jf::string_array(targets, root.key("target_modules"));
  }
  for (const std::string& name : names) {
    // PEFT matches a name against the end of a module's path ("q_proj", "self_attn.q_proj").
    const std::string last = name.substr(name.rfind('.') + 1);
    bool known = false;
    for (LoraProjection projection : kLoraProjections) known = known || lora_projection_name(projection) == last;
    if (!known)
      jf::fail_at(root.key("target_modules"),
                  fmt::format("\"{}\" is not a projection this model adapts (q_proj, k_proj, v_proj, o_proj, "
                              "gate_proj, up_proj, down_proj)",
                              name));
    config.targets.insert(last);
  }
  return config;
}

// "model.layers.{i}.self_attn.q_proj", "model.layers.{i}.mlp.gate_proj" or "model.layers.{i}.mlp.experts.{e}.up_proj":
// its layer, projection and expert; nullopt for any other module.
std::optional<LoraModule> parse_module(std::string_view module) {
  LoraModule parsed;
  long long layer = 0, expert = 0;
  char projection[32] = {};
  int consumed = 0;
  const std::string text(module);
  if (std::sscanf(text.c_str(), "model.layers.%lld.mlp.experts.%lld.%31[a-z_]%n", &layer, &expert, projection,
                  &consumed) == 3 &&
      consumed == static_cast<int>(text.size())) {
    parsed.expert = expert;
  } else if (!((std::sscanf(text.c_str(), "model.layers.%lld.self_attn.%31[a-z_]%n", &layer, projection, &consumed) ==
                    2 ||
                std::sscanf(text.c_str(), "model.layers.%lld.mlp.%31[a-z_]%n", &layer, projection, &consumed) == 2) &&
               consumed == static_cast<int>(text.size()))) {
    return std::nullopt;
  }
  parsed.layer = layer;
  for (LoraProjection candidate : kLoraProjections)
    if (lora_projection_name(candidate) == projection) {
      parsed.projection = candidate;
      return parsed;
    }
  return std::nullopt;
}

std::vector<float> to_floats(const TensorView& view, const std::filesystem::path& file) {
  std::vector<float> values(static_cast<std::size_t>(view.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (view.dtype) {
      case DType::F32: values[i] = view.as<float>()[i]; break;
      case DType::BF16: values[i] = bf16_to_f32(view.as<uint16_t>()[i]); break;
      case DType::F16: values[i] = f16_to_f32(view.as<uint16_t>()[i]); break;
      default:
        fail("{}: tensor \"{}\" is {}; LoRA weights must be F32, BF16 or F16", file.string(), view.name,
             dtype_name(view.dtype));
    }
  }
  return values;
}

}  // namespace

LoraWeights load_peft_adapter(const std::filesystem::path& dir, const ModelConfig& config, int64_t max_lora_rank) {
  const AdapterConfig adapter = read_config(dir, max_lora_rank);
  const std::filesystem::path file = dir / kWeightsFile;
  require(std::filesystem::is_regular_file(file), "{}: no such file (a PEFT adapter's weights, in safetensors)",
          file.string());
  const std::shared_ptr<const SafetensorsArchive> archive = SafetensorsArchive::open(file);
  // The projections of docs/model-format.md §3 and their [out, in].
  std::map<std::string, std::vector<int64_t>, std::less<>> projections;
  for (const ExpectedTensor& tensor : expected_tensors(config))
    if (tensor.role == TensorRole::Projection) projections.emplace(tensor.name, tensor.shape);

  std::map<std::string, LoraModule, std::less<>> modules;
  std::set<std::string, std::less<>> seen_b;
  for (const std::string& name : archive->tensor_names()) {
    const std::string_view full(name);
    const bool is_a = full.ends_with(".lora_A.weight"), is_b = full.ends_with(".lora_B.weight");
    require(full.starts_with(kPeftPrefix) && (is_a || is_b),
            "{}: tensor \"{}\" is not a PEFT LoRA weight (base_model.model.<module>.lora_A.weight or .lora_B.weight)",
            file.string(), name);
    const std::string module(full.substr(kPeftPrefix.size(), full.size() - kPeftPrefix.size() - 14));
    const auto shape = projections.find(module + ".weight");
    const std::optional<LoraModule> parsed = parse_module(module);
    require(shape != projections.end() && parsed.has_value(),
            "{}: tensor \"{}\": module \"{}\" is not a projection of this model's layers (docs/lora.md lists the "
            "names)",
            file.string(), name, module);
    require(adapter.targets.contains(lora_projection_name(parsed->projection)),
            "{}: tensor \"{}\": {} is not in {}'s target_modules", file.string(), name,
            lora_projection_name(parsed->projection), kConfigFile);
    const int64_t out = shape->second[0], in = shape->second[1];
    // The module's own rank (an expert's r / top_k comes as a rank_pattern entry) and scale (module_scale).
    const std::filesystem::path config_file = dir / kConfigFile;
    const std::optional<int64_t> pattern_rank = pattern_value(adapter.rank_pattern, module, config_file, "rank_pattern");
    const int64_t rank = pattern_rank.value_or(adapter.rank);
    const double alpha =
        pattern_value(adapter.alpha_pattern, module, config_file, "alpha_pattern").value_or(adapter.alpha);
    const TensorView& view = archive->at(name);
    const std::vector<int64_t> expected = is_a ? std::vector<int64_t>{rank, in} : std::vector<int64_t>{out, rank};
    require(view.shape == expected,
            "{}: tensor \"{}\" has shape {}, expected {} (rank {} from {}, the projection is [{}, {}])", file.string(),
            name, shape_string(view.shape), shape_string(expected), rank,
            pattern_rank ? "rank_pattern" : "r", out, in);
    LoraModule& entry = modules.try_emplace(module, *parsed).first->second;
    entry.rank = rank;
    entry.in = in;
    entry.out = out;
    entry.scale = module_scale(adapter, rank, alpha);
    if (is_a) {
      entry.a = to_floats(view, file);
    } else {
      entry.b = to_floats(view, file);
      for (float& value : entry.b) value = static_cast<float>(value * entry.scale);
      seen_b.insert(module);
    }
  }
  LoraWeights weights;
  weights.rank = adapter.rank;
  weights.scale = module_scale(adapter, adapter.rank, adapter.alpha);
  for (auto& [module, entry] : modules) {
    require(!entry.a.empty() && seen_b.contains(module), "{}: module \"{}\" has lora_{} but no lora_{}",
            file.string(), module, entry.a.empty() ? "B" : "A", entry.a.empty() ? "A" : "B");
    weights.modules.push_back(std::move(entry));
  }
  require(!weights.modules.empty(), "{}: no LoRA tensors", file.string());
  return weights;
}

}  // namespace beamline
