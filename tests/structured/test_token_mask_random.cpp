// Token masks on random grammars and a random vocabulary, against the byte-level matcher: random JSON schemas
// (and the Harmony template over them) compile, then random walks pick tokens from the mask. At every step a
// token is in the mask exactly when the bytes walked so far plus its bytes are still a viable prefix for a
// matcher fed bytes only (no vocabulary, no precomputed token classes), and a finished walk matches the grammar.
// The vocabulary is large and prefix-heavy on purpose, so the classification's shortcuts (whole subtrees of the
// token trie accepted or rejected at once) are taken often.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace beamline {
namespace {

// Every single byte; random words over JSON punctuation, a few letters and digits, escapes and UTF-8 pieces
// (whole characters and split ones); Harmony's grammar bytes; one special stop token last.
std::shared_ptr<const Vocabulary> random_vocabulary(uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> pieces = {"{", "}", "[", "]", "\"", ":", ",", " ", "a", "b", "c", "e", "x", "0",
                                           "1", "2", "9", "-", ".", "\\", "\\n", "\\u00", "é", "\xC3", "\xA9", "日",
                                           "\xE6\x97", "true", "null", "name", "\n", "\t", "A", "Z", "+", "@"};
  std::set<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.insert(std::string(1, static_cast<char>(b)));
  while (tokens.size() < 3000) {
    std::string token;
    const int parts = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < parts; ++i) token += pieces[rng() % pieces.size()];
    tokens.insert(token);
  }
  std::vector<std::string> list(tokens.begin(), tokens.end());
  std::shuffle(list.begin(), list.end(), rng);  // ids unrelated to byte order
  list.push_back("<|stop|>");
  return Vocabulary::from_tokens(list, {static_cast<TokenId>(list.size() - 1)});
}

class SchemaGenerator {
 public:
  explicit SchemaGenerator(uint32_t seed) : rng_(seed) {}

  std::string object(int depth) {
    const int count = 1 + pick(4);
    std::string properties, required;
    for (int i = 0; i < count; ++i) {
      std::string name(1, static_cast<char>('a' + i));
      if (pick(2)) name += 'x';
      if (i > 0) properties += ',';
      properties += '"';
      properties += name;
      properties += "\":";
      properties += value(depth + 1);
      if (pick(2)) {
        if (!required.empty()) required += ',';
        required += '"';
        required += name;
        required += '"';
      }
    }
    std::string schema = R"({"type":"object","properties":{)";
    schema += properties;
    schema += '}';
    if (!required.empty()) {
      schema += R"(,"required":[)";
      schema += required;
      schema += ']';
    }
    if (pick(3)) schema += R"(,"additionalProperties":false)";
    schema += '}';
    return schema;
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

  std::string value(int depth) {
    switch (pick(depth < 3 ? 15 : 12)) {
      case 0: return R"({"type":"string"})";
      case 1: return R"({"type":"string","maxLength":)" + std::to_string(pick(6)) + "}";
      case 2: return R"({"type":"string","minLength":1,"pattern":"^[a-c]+[0-9]?$"})";
      case 3: return R"({"type":"integer","minimum":)" + std::to_string(pick(20) - 10) + R"(,"maximum":)" +
                     std::to_string(10 + pick(200)) + "}";
      case 4: return R"({"type":"number"})";
      case 5: return R"({"type":"boolean"})";
      case 6: return pick(2) ? R"({"enum":["a","é日",null,1,"ab"]})" : R"({"enum":["a","é日",null,1]})";
      case 7: return R"({"anyOf":[{"type":"null"},{"type":"string","format":"date"}]})";
      // Counted repetitions: a length bound over the counter's threshold (a token of the vocabulary is at most ~24
      // bytes, so the classification drops the count where fewer than that are left); a pattern whose counted part is
      // followed by a character it also reads (email's label); many small items, counted per `, item`.
      case 8: return R"({"type":"string","maxLength":)" + std::to_string(17 + pick(40)) + "}";
      case 9: return pick(2) ? R"({"type":"string","format":"email"})"
                             : R"({"type":"string","pattern":"^[a-c]([a-c0-9-]{0,20}[a-c])?$"})";
      case 10: return R"({"type":"array","items":{"enum":[1,"a",null]},"minItems":)" + std::to_string(pick(20)) +
                      R"(,"maxItems":)" + std::to_string(20 + pick(3)) + "}";
      case 11: return R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":99},"minItems":17})";
      case 12: return R"({"type":"array","items":)" + value(depth + 1) + R"(,"maxItems":)" + std::to_string(1 + pick(3)) + "}";
      case 13: return object(depth + 1);
      default: return "{}";  // any JSON value
    }
  }

  std::mt19937 rng_;
};

// Every token's mask bit against the byte matcher's verdict at the current position.
void check_mask_here(GrammarMatcher& by_tokens, GrammarMatcher& by_bytes, const Vocabulary& v,
                     const std::vector<TokenId>& stops, std::vector<uint32_t>& mask, const std::string& what,
                     const std::string& text) {
  by_tokens.fill_next_token_mask(mask);
  for (TokenId t = 0; t < v.size(); ++t) {
    const bool bit = (mask[t >> 5] >> (t & 31)) & 1;
    bool viable;
    if (v.is_special(t)) {
      viable = by_bytes.can_end() && std::find(stops.begin(), stops.end(), t) != stops.end();
    } else {
      viable = !v.bytes(t).empty() && by_bytes.accept_bytes(v.bytes(t));
      if (viable) by_bytes.rollback(1);
    }
    ASSERT_EQ(bit, viable) << what << ": token " << t << " '" << v.bytes(t) << "' after '" << text << "'";
  }
}

// Random walks through the masks; every token of the vocabulary is checked against the byte-level matcher.
void check_walks(const Grammar& grammar, const std::shared_ptr<const Vocabulary>& vocabulary,
                 std::vector<TokenId> stops, int walks, uint32_t seed, const std::string& what) {
  const auto compiled = CompiledGrammar::compile(grammar, vocabulary, stops);
  const auto bytes_only = CompiledGrammar::compile(grammar, nullptr, {});  // no token classes at all
  const Vocabulary& v = *vocabulary;
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(v.mask_words());
  for (int walk = 0; walk < walks; ++walk) {
    GrammarMatcher by_tokens(compiled);
    GrammarMatcher by_bytes(bytes_only);
    std::string text;
    for (int step = 0; step < 120 && !by_tokens.completed(); ++step) {
      check_mask_here(by_tokens, by_bytes, v, stops, mask, what, text);
      if (::testing::Test::HasFatalFailure()) return;
      std::vector<TokenId> allowed;
      for (TokenId t = 0; t < v.size(); ++t)
        if ((mask[t >> 5] >> (t & 31)) & 1) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << what << ": a dead end after '" << text << "'";
      const TokenId chosen = allowed[rng() % allowed.size()];
      ASSERT_TRUE(by_tokens.accept_token(chosen)) << what;
      if (v.is_special(chosen)) break;
      ASSERT_TRUE(by_bytes.accept_bytes(v.bytes(chosen)));
      text += v.bytes(chosen);
    }
    if (by_tokens.completed()) {
      EXPECT_TRUE(GrammarMatcher::matches(*compiled, text)) << what << ": '" << text << "'";
    }
  }
}

// Random states deep inside counted repetitions: walks that pick a random viable byte at a time (most viable bytes are
// a string's or a label's characters, so walks run up to length bounds, which token walks seldom reach), checking
// the whole mask at every byte.
TEST(TokenMaskRandom, RandomByteWalksNearCountedBoundsAgreeWithTheByteMatcher) {
  const auto vocabulary = random_vocabulary(9);
  const TokenId stop = vocabulary->size() - 1;
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"e":{"type":"string","format":"email"},"n":{"type":"string","maxLength":20}},"required":["e","n"]})",
      R"({"type":"object","properties":{"l":{"type":"string","pattern":"^[a-c]([a-c0-9-]{0,17}[a-c])?$"},"s":{"type":"array","items":{"enum":[1,"a",null]},"minItems":3,"maxItems":18}},"required":["l","s"]})",
      R"({"type":"array","items":{"type":"string","maxLength":3},"minItems":17,"maxItems":19})"};
  std::mt19937 rng(21);
  std::vector<uint32_t> mask(vocabulary->mask_words());
  for (const std::string& schema : schemas) {
    const Grammar grammar = json_schema_grammar(schema);
    const auto compiled = CompiledGrammar::compile(grammar, vocabulary, {stop});
    const auto bytes_only = CompiledGrammar::compile(grammar, nullptr, {});
    for (int walk = 0; walk < 12; ++walk) {
      GrammarMatcher by_tokens(compiled);
      GrammarMatcher by_bytes(bytes_only);
      std::string text;
      for (int step = 0; step < 160 && !by_bytes.completed(); ++step) {
        check_mask_here(by_tokens, by_bytes, *vocabulary, {stop}, mask, schema, text);
        if (HasFatalFailure()) return;
        std::vector<char> viable;
        for (int b = 0; b < 256; ++b)
          if (by_bytes.accept_bytes(std::string(1, static_cast<char>(b)))) {
            by_bytes.rollback(1);
            viable.push_back(static_cast<char>(b));
          }
        if (viable.empty()) break;  // complete, nothing more to read
        const std::string byte(1, viable[rng() % viable.size()]);
        ASSERT_TRUE(by_bytes.accept_bytes(byte));
        ASSERT_TRUE(by_tokens.accept_bytes(byte));
        text += byte;
      }
    }
  }
}

TEST(TokenMaskRandom, RandomSchemasAgreeWithTheByteMatcher) {
  const auto vocabulary = random_vocabulary(7);
  const TokenId stop = vocabulary->size() - 1;
  SchemaGenerator generator(11);
  int compiled_count = 0;
  for (int i = 0; i < 12; ++i) {
    const std::string schema = generator.object(0);
    Grammar grammar;
    try {
      grammar = json_schema_grammar(schema);
      CompiledGrammar::compile(grammar, nullptr, {});
    } catch (const UnsupportedGrammar&) {
      continue;  // e.g. an anyOf whose branches overlap
    }
    ++compiled_count;
    check_walks(grammar, vocabulary, {stop}, 6, 100 + i, schema);
  }
  EXPECT_GE(compiled_count, 8);
}

TEST(TokenMaskRandom, HarmonyTemplateOverRandomToolSchemasAgreesWithTheByteMatcher) {
  const auto vocabulary = random_vocabulary(8);
  SchemaGenerator generator(12);
  HarmonyConstraintSpec spec;
  spec.tools.push_back({"functions.alpha", generator.object(1)});
  spec.tools.push_back({"functions.beta", generator.object(1)});
  spec.tools.push_back({"browser.search", std::nullopt});
  check_walks(harmony_grammar(spec), vocabulary, {}, 12, 5, "harmony");
}

}  // namespace
}  // namespace beamline
