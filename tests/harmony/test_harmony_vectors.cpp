// Every case of Harmony's official test vectors (tests/data/harmony/cases.json), run twice: with a
// byte-level tokenizer (no rank data needed: checks the text and where special tokens go) and with the
// real o200k_harmony tokenizer (exact token ids; skipped when the js-tiktoken rank export is missing).
#include <gtest/gtest.h>

#include <sstream>

#include "harmony/harmony_parser.h"
#include "harmony/harmony_render.h"
#include "harmony_fake_tokenizer.h"
#include "harmony_test_support.h"

namespace beamline::harmony {
namespace {

using testing::ByteTokenizer;
using testing::expected_text;
using testing::unordered;
using testing::vectors_dir;

const Json& cases() {
  static const Json json = Json::parse(testing::read_file(vectors_dir() / "cases.json"));
  return json;
}

std::vector<std::size_t> case_indices() {
  std::vector<std::size_t> indices(cases().size());
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = i;
  return indices;
}

std::string case_name(const ::testing::TestParamInfo<std::size_t>& info) {
  std::string name = cases()[info.param]["id"].get<std::string>();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

bool mentions(const Json& test_case, const std::string& phrase) {
  for (const Json& line : test_case["asserts"]) {
    if (line.get<std::string>().find(phrase) != std::string::npos) return true;
  }
  return false;
}

std::vector<TokenId> ids_from_text(const std::string& text) {
  std::vector<TokenId> ids;
  std::istringstream stream(text);
  for (long id; stream >> id;) ids.push_back(static_cast<TokenId>(id));
  return ids;
}

void check_render(const Json& test_case, const Tokenizer& tokenizer) {
  const std::string id = test_case["id"];
  const Conversation conversation = conversation_from_json(test_case["conversation"], id);
  RenderOptions options;
  for (const char* key : {"config", "effective_config"}) {
    if (test_case.contains(key)) options.auto_drop_analysis = test_case[key]["auto_drop_analysis"].get<bool>();
  }
  const Pieces pieces = test_case["kind"] == "render_completion"
                            ? render_for_completion(conversation, *role_from_name(test_case["next_role"].get<std::string>()), options)
                            : render_conversation(conversation, options);
  const std::string expected = expected_text(vectors_dir() / test_case["expected_file"].get<std::string>());
  EXPECT_EQ(pieces_to_text(pieces), expected);
  const std::vector<TokenId> ids = pieces_to_ids(pieces, tokenizer);
  if (test_case["compare"] == "tokens" || mentions(test_case, "encode(expected_text, allowed_special=all) == rendered")) {
    EXPECT_EQ(ids, tokenizer.encode(expected, true));
  }
  EXPECT_EQ(tokenizer.decode(ids), expected);
}

std::vector<Message> expected_messages(const Json& test_case) {
  return messages_from_json(test_case["expected_messages"], "expected_messages");
}

ParserOptions parser_options(const Json& test_case) {
  ParserOptions options;
  if (!test_case["parse_role"].is_null()) options.role = role_from_name(test_case["parse_role"].get<std::string>());
  options.strict = test_case["strict"].get<bool>();
  return options;
}

// The token sequences a parse case feeds the parser. With real ids from the files; with the byte
// tokenizer, the decoded texts the data set gives for the id files.
std::vector<std::vector<TokenId>> parse_inputs(const Json& test_case, const Tokenizer& tokenizer, bool real_ids) {
  const auto path = vectors_dir() / test_case["expected_file"].get<std::string>();
  std::vector<std::vector<TokenId>> inputs;
  if (test_case["file_format"] == "harmony_text") {
    inputs.push_back(tokenizer.encode(expected_text(path), true));
  } else if (real_ids) {
    inputs.push_back(ids_from_text(testing::read_file(path)));
    EXPECT_EQ(tokenizer.decode(inputs.back()), test_case["decoded_text"].get<std::string>());
    if (test_case.contains("rust_inline_token_ids")) {
      inputs.push_back(test_case["rust_inline_token_ids"].get<std::vector<TokenId>>());
      EXPECT_EQ(tokenizer.decode(inputs.back()), test_case["rust_inline_decoded_text"].get<std::string>());
    }
  } else {
    inputs.push_back(tokenizer.encode(test_case["decoded_text"].get<std::string>(), true));
    if (test_case.contains("rust_inline_decoded_text")) {
      inputs.push_back(tokenizer.encode(test_case["rust_inline_decoded_text"].get<std::string>(), true));
    }
  }
  return inputs;
}

void check_parse(const Json& test_case, const Tokenizer& tokenizer, bool real_ids) {
  const Json expected = to_json(expected_messages(test_case));
  for (const std::vector<TokenId>& ids : parse_inputs(test_case, tokenizer, real_ids)) {
    if (test_case["kind"] == "streaming_parse") {
      // As upstream: token by token, and no end-of-input call (the last message is terminated).
      StreamingParser parser(tokenizer, parser_options(test_case));
      for (TokenId id : ids) parser.push(id);
      ASSERT_EQ(parser.messages().size(), 3u);
      EXPECT_EQ(unordered(to_json(parser.messages())), unordered(expected));
    } else {
      EXPECT_EQ(unordered(to_json(parse_completion(tokenizer, ids, parser_options(test_case)))), unordered(expected));
    }
  }
  if (test_case["id"] == "test_tool_response_parsing") {
    // The Python half: the expected message rendered on its own, minus its <|end|>, is the file.
    Pieces pieces = render_message(expected_messages(test_case).front());
    ASSERT_EQ(pieces.back(), (Piece{true, "<|end|>"}));
    pieces.pop_back();
    const std::string file_text = expected_text(vectors_dir() / test_case["expected_file"].get<std::string>());
    EXPECT_EQ(pieces_to_text(pieces), file_text);
    EXPECT_EQ(pieces_to_ids(pieces, tokenizer), tokenizer.encode(file_text, true));
  }
}

void check_case(const Json& test_case, const Tokenizer& tokenizer, bool real_ids) {
  const std::string kind = test_case["kind"];
  if (kind == "render_completion" || kind == "render_conversation") {
    check_render(test_case, tokenizer);
  } else {
    ASSERT_TRUE(kind == "parse_completion_tokens" || kind == "streaming_parse") << kind;
    check_parse(test_case, tokenizer, real_ids);
  }
}

class HarmonyVector : public ::testing::TestWithParam<std::size_t> {};

TEST_P(HarmonyVector, ByteTokenizer) {
  const ByteTokenizer tokenizer;
  check_case(cases()[GetParam()], tokenizer, false);
}

TEST_P(HarmonyVector, O200kHarmony) {
  const Tokenizer* tokenizer = testing::o200k_harmony();
  if (tokenizer == nullptr) {
    GTEST_SKIP() << "no o200k rank data at " << testing::o200k_ranks_path()
                 << " (exported from js-tiktoken at test time; see tests/scripts)";
  }
  check_case(cases()[GetParam()], *tokenizer, true);
}

INSTANTIATE_TEST_SUITE_P(Cases, HarmonyVector, ::testing::ValuesIn(case_indices()), case_name);

TEST(HarmonyVectors, AllTwentyThreeCasesArePresent) {
  EXPECT_EQ(cases().size(), 23u);
  std::size_t render = 0, parse = 0;
  for (const Json& test_case : cases()) {
    const std::string kind = test_case["kind"];
    (kind.starts_with("render") ? render : parse) += 1;
  }
  EXPECT_EQ(render, 19u);
  EXPECT_EQ(parse, 4u);
}

}  // namespace
}  // namespace beamline::harmony
