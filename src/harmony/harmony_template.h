#pragma once
// The response template a checkpoint ships in `harmony.json` (HARMONY.md): channels, which channel carries
// reasoning / the final answer / tool calls, the tool namespace, the sampler's stop tokens, and the system
// message's identity, knowledge cutoff and default reasoning effort. Absent file or keys: built-in defaults.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "harmony/harmony_message.h"
#include "harmony/harmony_render.h"
#include "tokenizer/tokenizer.h"

namespace beamline::harmony {

struct HarmonyTemplate {
  std::vector<std::string> channels{"analysis", "commentary", "final"};
  std::string reasoning_channel = "analysis";
  std::string final_channel = "final";
  std::string tool_channel = "commentary";
  std::string tool_namespace = "functions";
  std::vector<std::string> stop_tokens{"<|return|>", "<|call|>"};
  // null in the file leaves the line out of the system message.
  std::optional<std::string> model_identity = "You are Beam, a large language model trained by Reflection AI.";
  std::optional<std::string> knowledge_cutoff = "2026-06";
  ReasoningEffort default_reasoning_effort = ReasoningEffort::Medium;

  // Errors name `source` (the file) and the key.
  static HarmonyTemplate from_json(const nlohmann::json& json, const std::string& source);
  static HarmonyTemplate from_file(const std::filesystem::path& path);
  // `<model_dir>/harmony.json` when it exists, the defaults otherwise.
  static HarmonyTemplate for_model(const std::filesystem::path& model_dir);

  nlohmann::json to_json() const;
  RenderOptions render_options(bool auto_drop_analysis = true) const;
  // The system message for a conversation: identity, cutoff, `current_date` (empty: no date line),
  // reasoning effort (the default when not given) and the channels, all required.
  SystemContent system_content(const std::string& current_date, std::optional<ReasoningEffort> effort) const;
  // The stop tokens' ids, looked up by string (an error names a token the tokenizer lacks).
  std::vector<TokenId> stop_token_ids(const Tokenizer& tokenizer) const;
};

}  // namespace beamline::harmony
