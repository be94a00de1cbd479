// --speculative-config: vLLM's JSON for ngram with its defaults, "none", and clear errors naming the flag and key.
#include <gtest/gtest.h>

#include <string>

#include "spec/speculative_config.h"
#include "util/error.h"

namespace beamline {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_speculative_config(text);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(SpeculativeConfig, ParsesNgramWithVllmDefaults) {
  const SpeculativeConfig full = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 2, "prompt_lookup_max": 4})");
  EXPECT_EQ(full.method, SpeculativeMethod::Ngram);
  EXPECT_EQ(full.num_speculative_tokens, 7);
  EXPECT_EQ(full.prompt_lookup_min, 2);
  EXPECT_EQ(full.prompt_lookup_max, 4);
  const SpeculativeConfig defaults = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3})");
  EXPECT_EQ(defaults.prompt_lookup_min, 5);
  EXPECT_EQ(defaults.prompt_lookup_max, 5);
  const SpeculativeConfig only_max =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})");
  EXPECT_EQ(only_max.prompt_lookup_min, 3);
  EXPECT_EQ(only_max.prompt_lookup_max, 3);
}

TEST(SpeculativeConfig, NoneTurnsItOff) {
  EXPECT_FALSE(parse_speculative_config("none").enabled());
  EXPECT_FALSE(parse_speculative_config("").enabled());
  EXPECT_FALSE(parse_speculative_config(R"({"method": "none"})").enabled());
  // Given, even as "none": serve's default drafter then stays off.
  EXPECT_TRUE(parse_speculative_config("none").given);
  EXPECT_FALSE(SpeculativeConfig().given);
}

TEST(SpeculativeConfig, BadValuesNameTheFlagAndKey) {
  EXPECT_NE(error_of(R"({"method": "ngram"})").find("\"num_speculative_tokens\" is required"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 0})").find("num_speculative_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": "4"})").find("num_speculative_tokens: must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2})")
                .find("prompt_lookup_min"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 4, "draft_tp": 1})").find("unknown key \"draft_tp\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "eagle", "num_speculative_tokens": 4})").find("\"method\""), std::string::npos);
  EXPECT_NE(error_of("{not json").find("--speculative-config"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("must be a JSON object"), std::string::npos);
  for (const char* text : {R"({"method": "ngram"})", R"({"method": "x"})", "{", R"({"method": 3})"}) {
    EXPECT_EQ(error_of(text).rfind("--speculative-config: ", 0), 0u) << error_of(text);
  }
}

TEST(SpeculativeConfig, ParsesDflash) {
  const SpeculativeConfig dflash =
      parse_speculative_config(R"({"method": "dflash", "model": "models/d", "num_speculative_tokens": 7})");
  EXPECT_EQ(dflash.method, SpeculativeMethod::DFlash);
  EXPECT_EQ(dflash.model, "models/d");
  EXPECT_EQ(dflash.num_speculative_tokens, 7);
  EXPECT_NE(error_of(R"({"method": "dflash", "num_speculative_tokens": 7})").find("model"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "dflash", "model": "d", "prompt_lookup_max": 3, "num_speculative_tokens": 7})")
                .find("prompt_lookup"),
            std::string::npos);
}

}  // namespace
}  // namespace beamline
