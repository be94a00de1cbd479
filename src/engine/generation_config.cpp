#include "engine/generation_config.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "util/error.h"

namespace beamline {
namespace {

template <typename T>
std::optional<T> number(const nlohmann::json& json, const char* key, const std::string& file) {
  if (!json.contains(key) || json[key].is_null()) return std::nullopt;
  require(json[key].is_number(), "{}: \"{}\" must be a number", file, key);
  return json[key].get<T>();
}

}  // namespace

GenerationConfig GenerationConfig::load(const std::filesystem::path& dir, const ModelConfig& config) {
  GenerationConfig result;
  for (int64_t id : config.eos_token_ids) result.eos_token_ids.push_back(static_cast<TokenId>(id));
  const std::filesystem::path path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return result;
  const std::string file = path.string();
  std::ifstream in(path);
  require(in.good(), "{}: cannot open", file);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: not valid JSON: {}", file, error.what());
  }
  require(json.is_object(), "{}: expected a JSON object", file);
  if (json.contains("eos_token_id") && !json["eos_token_id"].is_null()) {
    const nlohmann::json& eos = json["eos_token_id"];
    std::vector<TokenId> ids;
    auto add = [&](const nlohmann::json& value) {
      require(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < config.vocab_size,
              "{}: eos_token_id {} is not a token id of the vocabulary [0, {})", file, value.dump(), config.vocab_size);
      ids.push_back(value.get<TokenId>());
    };
    if (eos.is_array()) {
      for (const auto& value : eos) add(value);
    } else {
      add(eos);
    }
    result.eos_token_ids = std::move(ids);
  }
  result.temperature = number<float>(json, "temperature", file);
  result.top_p = number<float>(json, "top_p", file);
  result.min_p = number<float>(json, "min_p", file);
  result.repetition_penalty = number<float>(json, "repetition_penalty", file);
  result.top_k = number<int32_t>(json, "top_k", file);
  result.max_new_tokens = number<int32_t>(json, "max_new_tokens", file);
  return result;
}

}  // namespace beamline
