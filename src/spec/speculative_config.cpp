#include "spec/speculative_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>

#include "util/error.h"
#include "util/json_fields.h"

namespace beamline {
namespace {

constexpr std::string_view kFlag = "--speculative-config";

int32_t positive_key(const nlohmann::json& object, std::string_view key, int32_t fallback) {
  const std::optional<int64_t> value = json_fields::optional_integer(object, key, json_fields::Location());
  if (!value) return fallback;
  require(*value >= 1 && *value <= 1024, "{}: \"{}\" must be in [1, 1024] (got {})", kFlag, key, *value);
  return static_cast<int32_t>(*value);
}

void refuse_unknown_keys(const nlohmann::json& object) {
  static const char* const known[] = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                                      "model", "adaptive_verification"};
  for (const auto& [key, value] : object.items()) {
    const bool ok = std::find(std::begin(known), std::end(known), key) != std::end(known);
    require(ok, "{}: unknown key \"{}\" (beamline reads method, num_speculative_tokens, prompt_lookup_min, "
                "prompt_lookup_max, model, adaptive_verification)", kFlag, key);
  }
}

}  // namespace

SpeculativeConfig parse_speculative_config(std::string_view text) {
  SpeculativeConfig config;
  config.given = true;
  if (text.empty() || text == "none" || text == "None" || text == "null") return config;
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: not a JSON object or \"none\": {}", kFlag, error.what());
  }
  try {
    json_fields::expect_object(object, json_fields::Location(std::string(kFlag)));
    refuse_unknown_keys(object);
    const std::string method = json_fields::required_string(object, "method", json_fields::Location());
    if (method == "none") return config;  // '{"method": "none"}' as vLLM's off switch
    config.num_speculative_tokens = positive_key(object, "num_speculative_tokens", 0);
    config.adaptive_verification =
        json_fields::optional_bool(object, "adaptive_verification", json_fields::Location()).value_or(true);
    if (method == "ngram") {
      config.method = SpeculativeMethod::Ngram;
      require(config.num_speculative_tokens > 0, "{}: \"num_speculative_tokens\" is required for method \"ngram\"", kFlag);
      // vLLM's defaults: 5 when neither bound is given, else the one given for both.
      const int32_t min = positive_key(object, "prompt_lookup_min", 0);
      const int32_t max = positive_key(object, "prompt_lookup_max", 0);
      config.prompt_lookup_min = min > 0 ? min : (max > 0 ? max : 5);
      config.prompt_lookup_max = max > 0 ? max : config.prompt_lookup_min;
      require(config.prompt_lookup_min <= config.prompt_lookup_max,
              "{}: \"prompt_lookup_min\" ({}) must not exceed \"prompt_lookup_max\" ({})", kFlag,
              config.prompt_lookup_min, config.prompt_lookup_max);
      require(!object.contains("model"), "{}: \"model\" does not apply to method \"ngram\" (it needs no drafter)", kFlag);
    } else if (method == "dflash") {
      config.method = SpeculativeMethod::DFlash;
      config.model = json_fields::required_string(object, "model", json_fields::Location());
      require(config.num_speculative_tokens > 0, "{}: \"num_speculative_tokens\" is required for method \"dflash\"",
              kFlag);
      require(!object.contains("prompt_lookup_min") && !object.contains("prompt_lookup_max"),
              "{}: \"prompt_lookup_min\" / \"prompt_lookup_max\" apply to method \"ngram\" only", kFlag);
    } else {
      fail("{}: \"method\" must be \"ngram\", \"dflash\" or \"none\" (got \"{}\")", kFlag, method);
    }
  } catch (const Error& error) {
    const std::string what = error.what();
    if (what.starts_with(kFlag)) throw;
    fail("{}: {}", kFlag, what);
  }
  return config;
}

}  // namespace beamline
