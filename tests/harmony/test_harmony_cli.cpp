// `beamline harmony render | parse` end to end: the official render vectors through the CLI, parse output in
// Harmony's JSON form, and errors naming the file and field.
#include <gtest/gtest.h>

#include <cstdio>
#include <sys/wait.h>

#include "harmony_test_support.h"
#include "test_paths.h"

namespace beamline::harmony {
namespace {

using testing::expected_text;
using testing::vectors_dir;

struct CommandResult {
  int status = -1;
  std::string output;  // stdout (and stderr when asked)
};

CommandResult run(const std::string& arguments, bool with_stderr = false) {
  const std::string command = test_paths::beamline_exe() + " " + arguments + (with_stderr ? " 2>&1" : " 2>/dev/null");
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::filesystem::path write_temp(const std::string& name, const std::string& contents) {
  const auto path = std::filesystem::temp_directory_path() / ("beamline_harmony_cli_" + name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

const Json& cases() {
  static const Json json = Json::parse(testing::read_file(vectors_dir() / "cases.json"));
  return json;
}

TEST(HarmonyCli, RendersEveryRenderVector) {
  std::size_t rendered = 0;
  for (const Json& test_case : cases()) {
    const std::string kind = test_case["kind"];
    if (!kind.starts_with("render")) continue;
    const auto file = write_temp("conversation.json", test_case["conversation"].dump());
    std::string arguments = "harmony render --conversation " + file.string();
    if (test_case.contains("next_role")) arguments += " --next-role " + test_case["next_role"].get<std::string>();
    for (const char* key : {"config", "effective_config"}) {
      if (test_case.contains(key)) {
        arguments += std::string(" --auto-drop-analysis ") + (test_case[key]["auto_drop_analysis"].get<bool>() ? "true" : "false");
      }
    }
    const CommandResult result = run(arguments);
    EXPECT_EQ(result.status, 0) << test_case["id"];
    EXPECT_EQ(result.output, expected_text(vectors_dir() / test_case["expected_file"].get<std::string>())) << test_case["id"];
    ++rendered;
  }
  EXPECT_EQ(rendered, 19u);
}

TEST(HarmonyCli, AutoDropDefaultsToTrueAndCanBeTurnedOff) {
  const Json conversation = Json::parse(R"({"messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "channel": "analysis", "content": "think"},
      {"role": "assistant", "channel": "final", "content": "a"}]})");
  const auto file = write_temp("drop.json", conversation.dump());
  EXPECT_EQ(run("harmony render --conversation " + file.string()).output.find("think"), std::string::npos);
  EXPECT_NE(run("harmony render --auto-drop-analysis false --conversation " + file.string()).output.find("think"),
            std::string::npos);
}

TEST(HarmonyCli, BadConversationNamesFileAndField) {
  const auto file = write_temp("bad.json", R"({"messages": [{"role": "robot", "content": "x"}]})");
  const CommandResult result = run("harmony render --conversation " + file.string(), true);
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.output.find(file.string() + ": messages[0].role"), std::string::npos) << result.output;
}

TEST(HarmonyCli, ParseAndIdsWithO200kHarmony) {
  const auto ranks = testing::o200k_ranks_path();
  if (!std::filesystem::exists(ranks)) GTEST_SKIP() << "no o200k rank data at " << ranks;
  const std::string tokenizer = " --tiktoken " + ranks.string() + " --encoding o200k_harmony";
  for (const Json& test_case : cases()) {
    if (test_case["kind"] == "parse_completion_tokens") {
      // Text files are compared as upstream reads them: trailing whitespace trimmed.
      const auto path = vectors_dir() / test_case["expected_file"].get<std::string>();
      std::string arguments = test_case["file_format"] == "token_ids"
                                  ? "harmony parse --ids-file " + path.string()
                                  : "harmony parse --text-file " + write_temp("parse.txt", expected_text(path)).string();
      if (!test_case["parse_role"].is_null()) arguments += " --role " + test_case["parse_role"].get<std::string>();
      const CommandResult result = run(arguments + tokenizer);
      ASSERT_EQ(result.status, 0) << test_case["id"];
      EXPECT_EQ(testing::unordered(Json::parse(result.output)), testing::unordered(test_case["expected_messages"]))
          << test_case["id"];
    }
    if (test_case["id"] == "test_simple_convo") {
      const auto file = write_temp("ids.json", test_case["conversation"].dump());
      const CommandResult ids = run("harmony render --ids --next-role assistant --conversation " + file.string() + tokenizer);
      ASSERT_EQ(ids.status, 0);
      const auto text = write_temp("expected.txt", expected_text(vectors_dir() / test_case["expected_file"].get<std::string>()));
      const CommandResult encoded = run("tokenize --allow-special --text-file " + text.string() + tokenizer);
      EXPECT_EQ(ids.output, encoded.output);
    }
  }
  const auto bad = write_temp("bad_ids.txt", "200006 17 x9");
  const CommandResult result = run("harmony parse --ids-file " + bad.string() + tokenizer, true);
  EXPECT_EQ(result.status, 1);
  EXPECT_NE(result.output.find("'x9' (token 2)"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace beamline::harmony
