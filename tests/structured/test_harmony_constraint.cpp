// The Harmony template constraint: the assistant turns of the official vectors (tests/data/harmony) are accepted,
// as bytes and token by token through the masks, and mutated ones (an undeclared recipient, a channel that does not
// exist, arguments that break their schema, a missing header token, text after the end) are rejected.
#include <gtest/gtest.h>

#include <fstream>

#include "../harmony/harmony_fake_tokenizer.h"
#include "../harmony/harmony_test_support.h"
#include "harmony/harmony_message.h"
#include "harmony/harmony_render.h"
#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"

namespace beamline {
namespace {

using Json = harmony::Json;  // ordered, as the Harmony readers take it

HarmonyConstraintSpec vector_tools_spec() {
  HarmonyConstraintSpec spec;
  // As the vectors' developer and system messages declare them.
  spec.tools.push_back({"functions.lookup_weather", R"({"type": "object", "properties": {"location": {"type": "string"}},
                                                       "required": ["location"]})"});
  spec.tools.push_back({"browser.search", R"({"type": "object", "properties": {"query": {"type": "string"},
                        "topn": {"type": "number"}, "source": {"type": "string"}}, "required": ["query"]})"});
  spec.tools.push_back({"lookup_weather", R"({"type": "object", "properties": {"location": {"type": "string"}}})"});
  return spec;
}

enum class Verdict { kRejected, kPrefix, kComplete };

Verdict judge(const std::shared_ptr<const CompiledGrammar>& grammar, std::string_view harmony_text) {
  GrammarMatcher matcher(grammar);
  if (!matcher.accept_bytes(harmony_text_to_grammar_bytes(harmony_text))) return Verdict::kRejected;
  return matcher.completed() ? Verdict::kComplete : Verdict::kPrefix;
}

Verdict judge(const HarmonyConstraintSpec& spec, std::string_view harmony_text) {
  return judge(CompiledGrammar::compile(harmony_grammar(spec), nullptr, {}), harmony_text);
}

// The assistant turns of the vectors' conversations as the model emits them: runs of assistant messages, without
// the `<|start|>assistant` the prompt ends with, a final answer ending in <|return|> (history renders <|end|>).
std::vector<std::pair<std::string, bool>> vector_turns() {
  std::ifstream file(harmony::testing::vectors_dir() / "cases.json");
  const Json cases = Json::parse(file);
  std::vector<std::pair<std::string, bool>> turns;  // (text, ends the turn)
  for (const Json& test_case : cases) {
    if (!test_case.contains("conversation")) continue;
    const harmony::Conversation conversation = harmony::conversation_from_json(test_case["conversation"], "cases.json");
    std::string turn;
    auto close = [&] {
      if (turn.empty()) return;
      const std::string start = "<|start|>assistant";
      turn.erase(0, start.size());
      const bool ends = turn.ends_with("<|call|>") || turn.ends_with("<|end|>");
      const std::size_t final_at = turn.rfind("<|channel|>final"), last_start = turn.rfind("<|start|>");
      if (turn.ends_with("<|end|>") && final_at != std::string::npos &&
          (last_start == std::string::npos || final_at > last_start))
        turn.replace(turn.size() - 7, 7, "<|return|>");
      turns.emplace_back(turn, ends && !turn.ends_with("<|end|>"));
      turn.clear();
    };
    for (const harmony::Message& message : conversation.messages) {
      if (message.role != harmony::Role::Assistant) {
        close();
        continue;
      }
      turn += harmony::pieces_to_text(harmony::render_message(message));
    }
    close();
  }
  // The parse vectors' assistant outputs (test_streamable_parser's up to its call; test_simple_tool_call's form with
  // <|end|>, a truncated call). test_simple_reasoning_response's `<|return|>` between messages is the upstream
  // parser's leniency, not a turn: the engine stops at <|return|>, so the grammar does not allow it.
  turns.emplace_back("<|channel|>analysis<|message|>User asks \"Who is the current US president?\" It's 2025.<|end|>"
                     "<|start|>assistant<|channel|>commentary to=browser.search code<|message|>"
                     R"({"query": "current US president July 2025", "topn": 10, "source": "news"}<|call|>)",
                     true);
  turns.emplace_back("<|channel|>analysis<|message|>User asks: \"What is the weather in Tokyo?\" We need to use "
                     "lookup_weather tool.<|end|><|start|>assistant<|channel|>analysis to=lookup_weather code"
                     R"(<|message|>{"location": "Tokyo"})",
                     false);
  return turns;
}

TEST(HarmonyConstraint, AcceptsTheVectorsAssistantTurns) {
  const auto turns = vector_turns();
  ASSERT_GE(turns.size(), 6u);
  const auto grammar = CompiledGrammar::compile(harmony_grammar(vector_tools_spec()), nullptr, {});
  int complete = 0;
  for (const auto& [text, ends] : turns) {
    EXPECT_EQ(judge(grammar, text), ends ? Verdict::kComplete : Verdict::kPrefix) << text;
    complete += ends;
  }
  EXPECT_GE(complete, 4);
}

TEST(HarmonyConstraint, RejectsMutatedTurns) {
  const auto spec = CompiledGrammar::compile(harmony_grammar(vector_tools_spec()), nullptr, {});
  const std::string call = "<|channel|>commentary to=functions.lookup_weather <|constrain|>json<|message|>"
                           R"({"location": "San Francisco"})"
                           "<|call|>";
  const std::string answer = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>4"
                             "<|return|>";
  ASSERT_EQ(judge(spec, call), Verdict::kComplete);
  ASSERT_EQ(judge(spec, answer), Verdict::kComplete);
  ASSERT_EQ(judge(spec, " to=functions.lookup_weather<|channel|>commentary json<|message|>{\"location\": \"x\"}<|call|>"),
            Verdict::kComplete);
  auto replaced = [](std::string text, std::string_view from, std::string_view to) {
    const std::size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  for (const std::string& mutated :
       {replaced(call, "functions.lookup_weather", "functions.get_time"),     // undeclared tool
        replaced(call, "lookup_weather", "lookup_weathe"),                   // a prefix of a declared name
        replaced(call, "\"San Francisco\"", "42"),                           // argument of the wrong type
        replaced(call, "\"location\"", "\"place\""),                         // property not in the schema
        replaced(call, "<|call|>", "<|end|>"),                               // a call must end with <|call|>
        replaced(call, "}<|call|>", "<|call|>"),                             // arguments that do not parse
        replaced(call, "commentary", "final"),                               // a call on the answer's channel
        replaced(answer, "<|channel|>final", "<|channel|>finale"),           // no such channel
        replaced(answer, "final<|message|>", "final"),                       // header without <|message|>
        replaced(answer, "<|return|>", "<|call|>"),                          // an answer is no call
        replaced(answer, "4<|return|>", "4<|start|><|return|>"),             // a special token inside text
        answer + "more",                                                     // text after the end
        replaced(answer, "assistant", "user")}) {                            // another role's message
    EXPECT_NE(judge(spec, mutated), Verdict::kComplete) << mutated;
    GrammarMatcher matcher(spec);
    const std::string bytes = harmony_text_to_grammar_bytes(mutated);
    // Rejected outright, not merely unfinished, except for the <|end|> ending which may still go on.
    if (!mutated.ends_with("<|end|>")) {
      EXPECT_FALSE(matcher.accept_bytes(bytes)) << mutated;
    }
  }
}

TEST(HarmonyConstraint, ResponseFormatAndToolChoice) {
  HarmonyConstraintSpec spec = vector_tools_spec();
  spec.final_content = json_schema_grammar(R"({"type": "object", "properties": {"answer": {"type": "integer"}},
                                               "required": ["answer"], "additionalProperties": false})");
  EXPECT_EQ(judge(spec, "<|channel|>final<|message|>{\"answer\": 4}<|return|>"), Verdict::kComplete);
  EXPECT_EQ(judge(spec, "<|channel|>final<|message|>4<|return|>"), Verdict::kRejected);
  spec.require_tool_call = true;
  EXPECT_EQ(judge(spec, "<|channel|>final<|message|>{\"answer\": 4}<|return|>"), Verdict::kRejected);
  EXPECT_EQ(judge(spec, "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.lookup_weather"
                        "<|channel|>commentary <|constrain|>json<|message|>{\"location\": \"x\"}<|call|>"),
            Verdict::kComplete);
  spec.start = HarmonyConstraintSpec::Start::kAfterRecipient;  // after the prefill `<|channel|>commentary to=functions.`
  EXPECT_EQ(judge(spec, "lookup_weather <|constrain|>json<|message|>{\"location\": \"x\"}<|call|>"), Verdict::kComplete);
  EXPECT_EQ(judge(spec, "search <|constrain|>json<|message|>{\"query\": \"x\"}<|call|>"), Verdict::kRejected);
  spec.start = HarmonyConstraintSpec::Start::kAfterHeader;  // tools[0], header prefilled
  EXPECT_EQ(judge(spec, "{\"location\": \"x\"}<|call|>"), Verdict::kComplete);
  EXPECT_EQ(judge(spec, "{}<|call|>"), Verdict::kRejected);
}

TEST(HarmonyConstraint, RefusesAToolSchemaKeywordItCannotEnforceByName) {
  HarmonyConstraintSpec spec;
  spec.tools.push_back({"functions.f", R"({"type": "object", "patternProperties": {"^a": {}}})"});
  try {
    harmony_grammar(spec);
    ADD_FAILURE() << "patternProperties was accepted";
  } catch (const UnsupportedGrammar& error) {
    EXPECT_EQ(error.keyword(), "patternProperties");
    EXPECT_NE(std::string(error.what()).find("functions.f"), std::string::npos) << error.what();
  }
}

// Token by token through the masks: every token of each vector turn is allowed by the mask before it, and a
// special token outside the template (<|endoftext|>) never is. With the byte-level test tokenizer always, and with
// the real o200k_harmony ids when the rank export is present.
void check_masks_on_vector_turns(const Tokenizer& tokenizer) {
  const auto vocabulary = harmony_vocabulary(tokenizer);
  const auto grammar = CompiledGrammar::compile(harmony_grammar(vector_tools_spec()), vocabulary, {});
  const TokenId end_of_text = *tokenizer.token_to_id("<|endoftext|>");
  std::vector<uint32_t> mask(vocabulary->mask_words());
  for (const auto& [text, ends] : vector_turns()) {
    GrammarMatcher matcher(grammar);
    for (TokenId token : tokenizer.encode(text, true)) {
      matcher.fill_next_token_mask(mask);
      ASSERT_TRUE((mask[token >> 5] >> (token & 31)) & 1) << "token " << token << " in " << text;
      EXPECT_FALSE((mask[end_of_text >> 5] >> (end_of_text & 31)) & 1);
      ASSERT_TRUE(matcher.accept_token(token));
    }
    EXPECT_EQ(matcher.completed(), ends) << text;
  }
}

TEST(HarmonyConstraint, MasksAllowEveryTokenOfTheVectorTurns) {
  check_masks_on_vector_turns(harmony::testing::ByteTokenizer());
}

TEST(HarmonyConstraint, MasksAllowEveryTokenOfTheVectorTurnsOnO200k) {
  const Tokenizer* o200k = harmony::testing::o200k_harmony();
  if (o200k == nullptr) GTEST_SKIP() << "no o200k rank export at " << harmony::testing::o200k_ranks_path();
  check_masks_on_vector_turns(*o200k);
}

}  // namespace
}  // namespace beamline
