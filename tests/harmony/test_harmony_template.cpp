// harmony.json: defaults, every key read, errors naming the file and key, and its use by the renderer.
#include <gtest/gtest.h>

#include <fstream>

#include "harmony/harmony_template.h"
#include "harmony_fake_tokenizer.h"
#include "util/error.h"

namespace beamline::harmony {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("beamline_harmony_template_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(HarmonyTemplate, DefaultsWithoutAFile) {
  const HarmonyTemplate harmony_template = HarmonyTemplate::for_model(temp_dir("empty"));
  EXPECT_EQ(harmony_template.channels, (std::vector<std::string>{"analysis", "commentary", "final"}));
  EXPECT_EQ(harmony_template.tool_namespace, "functions");
  EXPECT_EQ(harmony_template.stop_tokens, (std::vector<std::string>{"<|return|>", "<|call|>"}));
  EXPECT_EQ(harmony_template.default_reasoning_effort, ReasoningEffort::Medium);
}

TEST(HarmonyTemplate, ReadsEveryKeyFromTheModelDirectory) {
  const auto dir = temp_dir("full");
  std::ofstream(dir / "harmony.json") << R"({"channels": ["think", "act", "say"], "reasoning_channel": "think",
    "final_channel": "say", "tool_channel": "act", "tool_namespace": "fn", "stop_tokens": ["<|end|>"],
    "model_identity": null, "knowledge_cutoff": "2025-01", "default_reasoning_effort": "high"})";
  const HarmonyTemplate harmony_template = HarmonyTemplate::for_model(dir);
  EXPECT_EQ(harmony_template.channels, (std::vector<std::string>{"think", "act", "say"}));
  EXPECT_EQ(harmony_template.reasoning_channel, "think");
  EXPECT_EQ(harmony_template.final_channel, "say");
  EXPECT_EQ(harmony_template.tool_channel, "act");
  EXPECT_EQ(harmony_template.tool_namespace, "fn");
  EXPECT_FALSE(harmony_template.model_identity.has_value());
  EXPECT_EQ(harmony_template.knowledge_cutoff, "2025-01");
  EXPECT_EQ(harmony_template.default_reasoning_effort, ReasoningEffort::High);
  const testing::ByteTokenizer tokenizer;
  EXPECT_EQ(harmony_template.stop_token_ids(tokenizer), std::vector<TokenId>{*tokenizer.token_to_id("<|end|>")});
  // Round trip through to_json.
  const HarmonyTemplate again = HarmonyTemplate::from_json(harmony_template.to_json(), "again");
  EXPECT_EQ(again.to_json(), harmony_template.to_json());

  const SystemContent system = harmony_template.system_content("2026-01-02", std::nullopt);
  EXPECT_FALSE(system.model_identity.has_value());
  EXPECT_EQ(system.conversation_start_date, "2026-01-02");
  EXPECT_EQ(system.reasoning_effort, ReasoningEffort::High);
  EXPECT_EQ(system.channel_config->valid_channels, harmony_template.channels);
}

TEST(HarmonyTemplate, ErrorsNameTheFileAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([])", "expected a JSON object"},
      {R"({"channel": []})", "unknown key 'channel'"},
      {R"({"channels": "analysis"})", "channels"},
      {R"({"channels": []})", "channels"},
      {R"({"channels": ["a b"]})", "channels"},
      {R"({"reasoning_channel": 3})", "reasoning_channel"},
      {R"({"final_channel": "answer"})", "final_channel"},
      {R"({"tool_namespace": "my tools"})", "tool_namespace"},
      {R"({"stop_tokens": [1]})", "stop_tokens[0]"},
      {R"({"model_identity": 1})", "model_identity"},
      {R"({"default_reasoning_effort": "max"})", "default_reasoning_effort"},
      {R"({"channels": )", "not valid JSON"},
  };
  for (const auto& [body, key] : cases) {
    const auto dir = temp_dir("bad");
    std::ofstream(dir / "harmony.json") << body;
    try {
      HarmonyTemplate::for_model(dir);
      ADD_FAILURE() << "no error for " << body;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find((dir / "harmony.json").string()), std::string::npos) << message;
      EXPECT_NE(message.find(key), std::string::npos) << body << " -> " << message;
    }
  }
}

TEST(HarmonyTemplate, StopTokenMissingFromTheTokenizer) {
  HarmonyTemplate harmony_template;
  harmony_template.stop_tokens = {"<|nope|>"};
  EXPECT_THROW(harmony_template.stop_token_ids(testing::ByteTokenizer{}), Error);
}

}  // namespace
}  // namespace beamline::harmony
