#include "harmony/harmony_template.h"

#include <algorithm>
#include <fstream>

#include "util/json_fields.h"
#include "util/error.h"

namespace beamline::harmony {

namespace jf = beamline::json_fields;

namespace {

constexpr const char* kKnownKeys[] = {"channels",       "reasoning_channel",   "final_channel",
                                      "tool_channel",   "tool_namespace",      "stop_tokens",
                                      "model_identity", "knowledge_cutoff",    "default_reasoning_effort"};

// Channel and namespace names sit inside message headers, where whitespace and '<' end a word.
bool is_header_word(const std::string& word) {
  return !word.empty() && std::none_of(word.begin(), word.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '<' || c == '>';
  });
}

}  // namespace

HarmonyTemplate HarmonyTemplate::from_json(const nlohmann::json& json, const std::string& source) {
  require(json.is_object(), "{}: expected a JSON object, got {}", source, json.type_name());
  for (const auto& item : json.items()) {
    const std::string& key = item.key();  // not a structured binding: clang before 16 cannot capture one in a lambda
    const bool known = std::any_of(std::begin(kKnownKeys), std::end(kKnownKeys), [&](const char* k) { return key == k; });
    require(known, "{}: unknown key '{}' (known keys: channels, reasoning_channel, final_channel, tool_channel, "
            "tool_namespace, stop_tokens, model_identity, knowledge_cutoff, default_reasoning_effort)", source, key);
  }
  auto key_path = [&](const char* key) { return source + ": " + key; };
  HarmonyTemplate result;
  if (const auto* channels = jf::find(json, std::string("channels"))) {
    result.channels = jf::string_array(*channels, key_path("channels"));
    require(!result.channels.empty(), "{}: needs at least one channel", key_path("channels"));
  }
  for (const auto& [key, field] : {std::pair{"reasoning_channel", &result.reasoning_channel},
                                   std::pair{"final_channel", &result.final_channel},
                                   std::pair{"tool_channel", &result.tool_channel},
                                   std::pair{"tool_namespace", &result.tool_namespace}}) {
    if (const auto* value = jf::find(json, std::string(key))) {
      require(value->is_string(), "{}: expected a string, got {}", key_path(key), value->type_name());
      *field = value->get<std::string>();
    }
    require(is_header_word(*field), "{}: '{}' must be one word without spaces or '<'", key_path(key), *field);
  }
  for (const auto& [key, channel] : {std::pair{"reasoning_channel", result.reasoning_channel},
                                     std::pair{"final_channel", result.final_channel},
                                     std::pair{"tool_channel", result.tool_channel}}) {
    require(std::find(result.channels.begin(), result.channels.end(), channel) != result.channels.end(),
            "{}: '{}' is not one of the template's channels", key_path(key), channel);
  }
  for (const std::string& channel : result.channels) {
    require(is_header_word(channel), "{}: '{}' must be one word without spaces or '<'", key_path("channels"), channel);
  }
  if (const auto* stops = jf::find(json, std::string("stop_tokens"))) {
    result.stop_tokens = jf::string_array(*stops, key_path("stop_tokens"));
    require(!result.stop_tokens.empty(), "{}: needs at least one stop token", key_path("stop_tokens"));
  }
  // Present-but-null is how a checkpoint leaves these lines out; absent keeps the default.
  for (const auto& [key, field] : {std::pair{"model_identity", &result.model_identity},
                                   std::pair{"knowledge_cutoff", &result.knowledge_cutoff}}) {
    auto it = json.find(key);
    if (it == json.end()) continue;
    require(it->is_string() || it->is_null(), "{}: expected a string or null, got {}", key_path(key), it->type_name());
    *field = it->is_null() ? std::nullopt : std::optional(it->get<std::string>());
  }
  if (const auto* effort = jf::find(json, std::string("default_reasoning_effort"))) {
    const std::string at = key_path("default_reasoning_effort");
    require(effort->is_string(), "{}: expected a string, got {}", at, effort->type_name());
    auto parsed = reasoning_effort_from_name(effort->get<std::string>());
    require(parsed.has_value(), "{}: '{}' is not low, medium or high", at, effort->get<std::string>());
    result.default_reasoning_effort = *parsed;
  }
  return result;
}

HarmonyTemplate HarmonyTemplate::from_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  require(file.good(), "{}: cannot open the Harmony template", path.string());
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: not valid JSON ({})", path.string(), error.what());
  }
  return from_json(json, path.string());
}

HarmonyTemplate HarmonyTemplate::for_model(const std::filesystem::path& model_dir) {
  const std::filesystem::path path = model_dir / "harmony.json";
  return std::filesystem::exists(path) ? from_file(path) : HarmonyTemplate{};
}

nlohmann::json HarmonyTemplate::to_json() const {
  nlohmann::json json = {{"channels", channels},
                         {"reasoning_channel", reasoning_channel},
                         {"final_channel", final_channel},
                         {"tool_channel", tool_channel},
                         {"tool_namespace", tool_namespace},
                         {"stop_tokens", stop_tokens},
                         {"default_reasoning_effort", reasoning_effort_name(default_reasoning_effort)}};
  json["model_identity"] = model_identity ? nlohmann::json(*model_identity) : nlohmann::json(nullptr);
  json["knowledge_cutoff"] = knowledge_cutoff ? nlohmann::json(*knowledge_cutoff) : nlohmann::json(nullptr);
  return json;
}

RenderOptions HarmonyTemplate::render_options(bool auto_drop_analysis) const {
  return RenderOptions{auto_drop_analysis, reasoning_channel, final_channel, tool_namespace, tool_channel};
}

SystemContent HarmonyTemplate::system_content(const std::string& current_date,
                                              std::optional<ReasoningEffort> effort) const {
  SystemContent system;
  system.model_identity = model_identity;
  system.knowledge_cutoff = knowledge_cutoff;
  if (!current_date.empty()) system.conversation_start_date = current_date;
  system.reasoning_effort = effort.value_or(default_reasoning_effort);
  system.channel_config = ChannelConfig{channels, true};
  return system;
}

std::vector<TokenId> HarmonyTemplate::stop_token_ids(const Tokenizer& tokenizer) const {
  std::vector<TokenId> ids;
  for (const std::string& token : stop_tokens) {
    auto id = tokenizer.token_to_id(token);
    require(id.has_value(), "harmony.json stop token {} is not a token of the model's tokenizer", token);
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace beamline::harmony
