// Conformance of the JSON Schema grammar as a matcher on the JSON Schema Test Suite (npm
// `json-schema-test-suite`, pinned in tests/js/package.json; draft 4). Every instance goes through the
// matcher in canonical form (sorted keys, no whitespace; the grammar is compiled with sorted keys). A group
// is supported when its schema compiles and every valid instance matches and every invalid one does not;
// a group whose schema is refused must be refused naming a keyword. A compiled group that gets an instance
// wrong is a defect and fails the test; the supported share must reach 80%.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace beamline {
namespace {

namespace fs = std::filesystem;
const fs::path kSuite = fs::path(BEAMLINE_SOURCE_DIR) / "tests/js/node_modules/json-schema-test-suite";

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(JsonSchemaTestSuite, Draft4) {
  if (!fs::exists(kSuite / "tests/draft4")) GTEST_SKIP() << "run scripts/setup.sh (npm ci in tests/js) first";
  JsonSchemaOptions options;
  options.sorted_keys = true;
  for (const auto& entry : fs::recursive_directory_iterator(kSuite / "remotes"))
    if (entry.is_regular_file())
      options.documents["http://localhost:1234/" + fs::relative(entry.path(), kSuite / "remotes").generic_string()] =
          read(entry.path());
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kSuite / "tests/draft4"))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  int groups = 0, supported = 0, tests = 0, tests_supported = 0;
  std::map<std::string, int> refused_by_keyword;
  for (const fs::path& file : files) {
    for (const auto& group : nlohmann::json::parse(read(file))) {
      ++groups;
      tests += static_cast<int>(group["tests"].size());
      std::string where = file.filename().string() + " / " + group["description"].get<std::string>();
      std::shared_ptr<const CompiledGrammar> grammar;
      try {
        grammar = CompiledGrammar::compile(json_schema_grammar(group["schema"].dump(), options), nullptr, {});
      } catch (const UnsupportedGrammar& e) {
        ++refused_by_keyword[e.keyword()];
        std::printf("refused   %-70s %s\n", where.c_str(), e.what());
        continue;
      }
      bool all_right = true;
      for (const auto& test : group["tests"]) {
        std::string instance = canonical_json(test["data"].dump());
        bool matched = GrammarMatcher::matches(*grammar, instance);
        EXPECT_EQ(matched, test["valid"].get<bool>())
            << where << " / " << test["description"].get<std::string>() << ": " << instance;
        all_right = all_right && matched == test["valid"].get<bool>();
      }
      if (all_right) {
        ++supported;
        tests_supported += static_cast<int>(group["tests"].size());
      }
      std::printf("%-9s %s\n", all_right ? "supported" : "WRONG", where.c_str());
    }
  }
  std::printf("\ndraft 4: %d of %d groups supported (%.1f%%), %d of %d tests in them\n", supported, groups,
              100.0 * supported / groups, tests_supported, tests);
  for (const auto& [keyword, count] : refused_by_keyword) std::printf("refused by '%s': %d groups\n", keyword.c_str(), count);
  EXPECT_GE(supported * 10, groups * 8) << "under 80% of the groups supported";
}

}  // namespace
}  // namespace beamline
