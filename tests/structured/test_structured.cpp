// The grammar engine: front ends (regex, EBNF, JSON Schema, choices), the pushdown matcher, and token masks
// checked against the brute-force answer (walk every token through a fresh matcher) on random paths.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "structured/ebnf.h"
#include "structured/json_schema.h"
#include "structured/regex.h"
#include "structured/token_mask.h"

namespace beamline {
namespace {

std::shared_ptr<const CompiledGrammar> compile(const Grammar& g, std::shared_ptr<const Vocabulary> v = nullptr,
                                               std::vector<TokenId> stops = {}) {
  return CompiledGrammar::compile(g, std::move(v), std::move(stops));
}

bool matches(const Grammar& g, std::string_view text) { return GrammarMatcher::matches(*compile(g), text); }

bool schema_matches(const std::string& schema, const std::string& instance, bool sorted = true) {
  JsonSchemaOptions options;
  options.sorted_keys = sorted;
  return matches(json_schema_grammar(schema, options), instance);
}

std::string refused_keyword(const std::string& schema) {
  try {
    compile(json_schema_grammar(schema));
  } catch (const UnsupportedGrammar& e) {
    return e.keyword();
  }
  return "";
}

TEST(Regex, FullMatchSemantics) {
  Grammar g = regex_grammar("a[0-9]{2,3}(x|yz)*\\.?");
  EXPECT_TRUE(matches(g, "a12"));
  EXPECT_TRUE(matches(g, "a123xyzx."));
  EXPECT_FALSE(matches(g, "a1"));
  EXPECT_FALSE(matches(g, "a1234"));
  EXPECT_FALSE(matches(g, "a12y"));
  EXPECT_TRUE(matches(regex_grammar("[^a-c]+"), "zé"));  // a negated class reads whole UTF-8 characters
  EXPECT_FALSE(matches(regex_grammar("[^a-c]+"), "zb"));
  EXPECT_FALSE(matches(regex_grammar("."), "\n"));
  EXPECT_TRUE(matches(regex_grammar("\\d+\\s\\w"), "42 _"));
}

TEST(Regex, RefusesWhatItCannotEnforceByName) {
  for (const char* pattern : {"(?=a)b", "a\\1", "\\bword", "\\p{L}", "a^b"}) {
    try {
      regex_grammar(pattern);
      ADD_FAILURE() << pattern << " was accepted";
    } catch (const UnsupportedGrammar& e) {
      EXPECT_EQ(e.keyword(), "regex") << pattern;
    }
  }
}

TEST(Ebnf, GbnfSubset) {
  Grammar g = ebnf_grammar(R"(
    root ::= greeting (", " name)+ "!"   # comment
    greeting ::= "hi" | 'hello'
    name ::= [A-Z] [a-z]{1,8}
  )");
  EXPECT_TRUE(matches(g, "hi, Bob!"));
  EXPECT_TRUE(matches(g, "hello, Ann, Zed!"));
  EXPECT_FALSE(matches(g, "hi!"));
  EXPECT_FALSE(matches(g, "hi, bob!"));
  Grammar nested = ebnf_grammar("root ::= \"(\" root* \")\"");  // recursion through a call stack
  EXPECT_TRUE(matches(nested, "(()(()))"));
  EXPECT_FALSE(matches(nested, "(()"));
  EXPECT_THROW(compile(ebnf_grammar("root ::= root \"a\" | \"b\"")), UnsupportedGrammar);  // left recursion
  EXPECT_THROW(ebnf_grammar("root ::= missing"), UnsupportedGrammar);
}

TEST(Choice, ExactlyOneOfTheStrings) {
  Grammar g = choice_grammar({"yes", "no", "not sure"});
  EXPECT_TRUE(matches(g, "no"));
  EXPECT_TRUE(matches(g, "not sure"));
  EXPECT_FALSE(matches(g, "not"));
}

TEST(JsonSchema, TypesAndObjects) {
  std::string schema = R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}},
                           "required":["a"],"additionalProperties":false})";
  EXPECT_TRUE(schema_matches(schema, R"({"a":"x","b":3})"));
  EXPECT_TRUE(schema_matches(schema, R"({"a":"x"})"));
  EXPECT_TRUE(schema_matches(schema, R"({"a": "x", "b": -0})"));  // one optional space after ':' and ','
  EXPECT_FALSE(schema_matches(schema, R"({"b":3})"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":"x","c":1})"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":1})"));
  // Declared order when keys are not sorted.
  EXPECT_TRUE(schema_matches(schema, R"({"b":3,"a":"x"})", false));
  EXPECT_FALSE(schema_matches(schema, R"({"a":"x","b":3})", false));
}

TEST(JsonSchema, AdditionalPropertiesAnywhereButNeverADeclaredName) {
  std::string schema = R"({"properties":{"a":{"type":"integer"},"c":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})";
  EXPECT_TRUE(schema_matches(schema, R"({"a":1,"b":true,"c":2})"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":1,"b":3})"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":1,"a":true})"));
  EXPECT_TRUE(schema_matches(schema, R"({"aa":false})"));
}

TEST(JsonSchema, NumbersAndStrings) {
  EXPECT_TRUE(schema_matches(R"({"minimum":1.1,"exclusiveMinimum":true})", "1.11"));
  EXPECT_FALSE(schema_matches(R"({"minimum":1.1,"exclusiveMinimum":true})", "1.1"));
  EXPECT_TRUE(schema_matches(R"({"minimum":-5,"maximum":-1})", "-2.5"));
  EXPECT_FALSE(schema_matches(R"({"minimum":-5,"maximum":-1})", "-0.5"));
  EXPECT_FALSE(schema_matches(R"({"minimum":-5,"maximum":-1})", "-5.01"));
  EXPECT_TRUE(schema_matches(R"({"type":"integer","minimum":10,"maximum":250})", "199"));
  EXPECT_FALSE(schema_matches(R"({"type":"integer","minimum":10,"maximum":250})", "251"));
  EXPECT_FALSE(schema_matches(R"({"type":"integer","minimum":10,"maximum":250})", "9"));
  EXPECT_TRUE(schema_matches(R"({"multipleOf":1.5})", "4.5"));
  EXPECT_FALSE(schema_matches(R"({"multipleOf":1.5})", "35"));
  EXPECT_TRUE(schema_matches(R"({"multipleOf":0.0001})", "0.0075"));
  EXPECT_FALSE(schema_matches(R"({"multipleOf":0.0001})", "0.00751"));
  EXPECT_TRUE(schema_matches(R"({"type":"string","maxLength":2})", "\"é\\n\""));
  EXPECT_FALSE(schema_matches(R"({"type":"string","maxLength":2})", "\"abc\""));
  EXPECT_FALSE(schema_matches(R"({"type":"string"})", "\"\\u0061\""));  // only canonical escapes
  EXPECT_TRUE(schema_matches(R"({"pattern":"a+"})", "\"xaay\""));
  EXPECT_TRUE(schema_matches(R"({"pattern":"^a+$"})", "12"));  // keywords of other types do not apply
  EXPECT_FALSE(schema_matches(R"({"pattern":"^a+$"})", "\"ab\""));
  EXPECT_TRUE(schema_matches(R"({"type":"string","format":"date-time"})", "\"2026-12-02T10:00:00Z\""));
  EXPECT_FALSE(schema_matches(R"({"type":"string","format":"date-time"})", "\"2026-13-02T10:00:00Z\""));
  // A branch whose enum holds only scalars is no composite literal (game_move's promotion in the scale bench).
  const std::string promotion = R"({"oneOf":[{"enum":["queen","rook"]},{"type":"null"}]})";
  EXPECT_TRUE(schema_matches(promotion, "\"rook\""));
  EXPECT_TRUE(schema_matches(promotion, "null"));
  EXPECT_FALSE(schema_matches(promotion, "\"pawn\""));
  const std::string date = R"({"type":"string","format":"date"})";
  EXPECT_TRUE(schema_matches(date, "\"2026-01-31\""));
  EXPECT_FALSE(schema_matches(date, "\"2026-04-31\""));  // April has 30 days
  EXPECT_FALSE(schema_matches(date, "\"2026-02-29\""));
  EXPECT_TRUE(schema_matches(date, "\"2028-02-29\""));
  EXPECT_TRUE(schema_matches(date, "\"2000-02-29\""));   // divisible by 400
  EXPECT_FALSE(schema_matches(date, "\"1900-02-29\""));  // by 100, not 400
}

// Every string of up to `length` characters from `alphabet` (each a character and its canonical JSON encoding).
std::vector<std::pair<std::u32string, std::string>> all_strings(const std::vector<std::pair<char32_t, std::string>>& alphabet,
                                                                size_t length) {
  std::vector<std::pair<std::u32string, std::string>> out = {{U"", ""}};
  for (size_t begin = 0, end = 1, n = 0; n < length; ++n) {
    for (size_t i = begin; i < end; ++i)
      for (const auto& [c, encoded] : alphabet) out.emplace_back(out[i].first + c, out[i].second + encoded);
    begin = end;
    end = out.size();
  }
  return out;
}

// minLength / maxLength count characters (UTF-8 characters and escapes alike) under a counter, alone, with a
// pattern, and where a combinator needs them unrolled; every string of a small alphabet is checked.
TEST(JsonSchema, LengthBoundsCountCharacters) {
  const auto strings = all_strings({{U'a', "a"}, {U'é', "é"}, {U'\n', "\\n"}, {U'日', "日"}, {U'\x01', "\\u0001"}}, 6);
  struct Case {
    const char* schema;
    std::function<bool(const std::u32string&)> expected;
  };
  const Case cases[] = {
      {R"({"type":"string","minLength":2,"maxLength":4})", [](const auto& s) { return s.size() >= 2 && s.size() <= 4; }},
      {R"({"type":"string","maxLength":0})", [](const auto& s) { return s.empty(); }},
      {R"({"type":"string","minLength":5})", [](const auto& s) { return s.size() >= 5; }},
      {R"({"type":"string","minLength":1,"maxLength":5,"pattern":"^a"})",
       [](const auto& s) { return s.size() >= 1 && s.size() <= 5 && s[0] == U'a'; }},
      {R"({"type":"string","maxLength":3,"pattern":"é$"})", [](const auto& s) { return s.size() <= 3 && !s.empty() && s.back() == U'é'; }},
      {R"({"allOf":[{"maxLength":5},{"minLength":2},{"maxLength":4}],"type":"string"})",
       [](const auto& s) { return s.size() >= 2 && s.size() <= 4; }},
      {R"({"anyOf":[{"type":"string","maxLength":1},{"type":"string","minLength":4,"pattern":"^a"}]})",  // unrolled
       [](const auto& s) { return s.size() <= 1 || (s.size() >= 4 && s[0] == U'a'); }},
      {R"({"not":{"type":"string","maxLength":2}})", [](const auto& s) { return s.size() > 2; }},  // unrolled
      {R"({"type":"string","minLength":3,"pattern":"^(aa)+$"})",  // even lengths only
       [](const auto& s) { return s.size() >= 4 && s.size() % 2 == 0 && s.find_first_not_of(U'a') == std::u32string::npos; }},
      // After "a" nothing within 2..3 characters can follow: a counter would allow a dead end, so it is unrolled.
      {R"({"type":"string","minLength":2,"maxLength":3,"pattern":"^(a|é日\n)$"})",
       [](const auto& s) { return s == U"é日\n"; }},
  };
  for (const Case& c : cases) {
    const auto compiled = compile(json_schema_grammar(c.schema));
    for (const auto& [value, encoded] : strings)
      ASSERT_EQ(GrammarMatcher::matches(*compiled, "\"" + encoded + "\""), c.expected(value)) << c.schema << " on " << encoded;
  }
  EXPECT_TRUE(schema_matches(R"({"type":["string","integer"],"maxLength":1})", "12345"));  // integers keep no length
  // A counter costs no states per count: a bound of 100,000 compiles to the same tables as one of 3.
  const auto small = compile(json_schema_grammar(R"({"type":"string","maxLength":3})"));
  const auto large = compile(json_schema_grammar(R"({"type":"string","minLength":2,"maxLength":100000})"));
  EXPECT_EQ(small->tables().num_states, large->tables().num_states);
  EXPECT_TRUE(GrammarMatcher::matches(*large, "\"" + std::string(100000, 'x') + "\""));
  EXPECT_FALSE(GrammarMatcher::matches(*large, "\"" + std::string(100001, 'x') + "\""));
  // No string satisfies it: refused as an empty grammar, like any other.
  EXPECT_EQ(refused_keyword(R"({"type":"string","minLength":3,"maxLength":2})"), "grammar");
  EXPECT_EQ(refused_keyword(R"({"type":"string","pattern":"^[a-z]{3}@$","maxLength":3})"), "grammar");
}

// Repetitions over kUnrolledRepeats whose body is a prefix code are counted (few states, whatever the bound); others
// are unrolled; both match exactly the repetitions within the bounds.
TEST(Regex, LargeRepetitionsAreCounted) {
  auto repeated = [](const std::string& unit, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += unit;
    return out;
  };
  const Grammar counted = regex_grammar("[a-c]{20,300}x");
  EXPECT_LT(compile(counted)->tables().num_states, 10);
  for (int n : {0, 19, 20, 21, 299, 300, 301})
    EXPECT_EQ(matches(counted, repeated("b", n) + "x"), n >= 20 && n <= 300) << n;
  const Grammar words = regex_grammar("(ab|c){17,40}");
  EXPECT_LT(compile(words)->tables().num_states, 10);
  for (int n : {16, 17, 40, 41}) {
    EXPECT_EQ(matches(words, repeated("abc", n)), 2 * n >= 17 && 2 * n <= 40) << n;
    EXPECT_EQ(matches(words, repeated("c", n)), n >= 17 && n <= 40) << n;
  }
  EXPECT_FALSE(matches(words, repeated("c", 20) + "a"));
  const Grammar at_least = ebnf_grammar("root ::= \"[\" [0-9]{30,} \"]\"");
  EXPECT_FALSE(matches(at_least, "[" + repeated("7", 29) + "]"));
  EXPECT_TRUE(matches(at_least, "[" + repeated("7", 30) + "]"));
  EXPECT_TRUE(matches(at_least, "[" + repeated("7", 3000) + "]"));
  const Grammar ambiguous = regex_grammar("(a|aa){20,21}");  // not a prefix code: unrolled
  for (int n : {19, 20, 42, 43}) EXPECT_EQ(matches(ambiguous, repeated("a", n)), n >= 20 && n <= 42) << n;
}

// minItems / maxItems over kUnrolledRepeats are counted too: the repetition `, item` calls the item's rule, and the
// count lives in the repetition's frame, so the grammar has a few states whatever the bound.
TEST(JsonSchema, LargeItemCountsAreCounted) {
  auto array = [](int n, const std::string& item) {
    std::string out = "[";
    for (int i = 0; i < n; ++i) out += (i > 0 ? ", " : "") + item;
    return out + "]";
  };
  const std::string bounded = R"({"type":"array","items":{"type":"integer"},"minItems":17,"maxItems":1000})";
  EXPECT_LT(compile(json_schema_grammar(bounded))->tables().num_states, 60);
  for (int n : {0, 16, 17, 18, 999, 1000, 1001})
    EXPECT_EQ(schema_matches(bounded, array(n, "7")), n >= 17 && n <= 1000) << n;
  const std::string at_least = R"({"type":"array","items":{"type":"string","maxLength":2},"minItems":40})";
  for (int n : {39, 40, 41, 500}) EXPECT_EQ(schema_matches(at_least, array(n, "\"ab\"")), n >= 40) << n;
  EXPECT_FALSE(schema_matches(at_least, array(45, "\"abc\"")));
  // Nested frames of the same rule keep their own counts.
  const std::string nested = R"({"$defs":{"row":{"type":"array","items":{"$ref":"#/$defs/row"},"maxItems":20}},
      "$ref":"#/$defs/row"})";
  EXPECT_TRUE(schema_matches(nested, array(20, array(20, "[]"))));
  EXPECT_FALSE(schema_matches(nested, array(20, array(21, "[]"))));
  EXPECT_FALSE(schema_matches(nested, array(21, array(2, "[]"))));
  // After a tuple; and unsatisfiable items leave only the empty array.
  const std::string tuple = R"({"type":"array","prefixItems":[{"type":"string"},{"type":"null"}],
      "items":{"type":"boolean"},"maxItems":30})";
  EXPECT_TRUE(schema_matches(tuple, "[\"x\", null, " + array(28, "true").substr(1)));
  EXPECT_FALSE(schema_matches(tuple, "[\"x\", null, " + array(29, "true").substr(1)));
  const std::string impossible = R"({"type":"array","items":{"type":"string","minLength":3,"maxLength":2},"maxItems":50})";
  EXPECT_TRUE(schema_matches(impossible, "[]"));
  EXPECT_FALSE(schema_matches(impossible, "[\"\"]"));
}

TEST(JsonSchema, CombinatorsAndReferences) {
  std::string one_of = R"({"oneOf":[{"type":"integer"},{"minimum":2}]})";
  EXPECT_TRUE(schema_matches(one_of, "1"));
  EXPECT_TRUE(schema_matches(one_of, "2.5"));
  EXPECT_FALSE(schema_matches(one_of, "3"));
  EXPECT_FALSE(schema_matches(one_of, "1.5"));
  EXPECT_TRUE(schema_matches(R"({"not":{"type":"integer"}})", "\"a\""));
  EXPECT_FALSE(schema_matches(R"({"not":{"type":"integer"}})", "1"));
  std::string tree = R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
      "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"],"additionalProperties":false}},
      "$ref":"#/$defs/node"})";
  EXPECT_TRUE(schema_matches(tree, R"({"children":[{"value":2},{"children":[],"value":3}],"value":1})"));
  EXPECT_FALSE(schema_matches(tree, R"({"children":[{"value":"x"}],"value":1})"));
  EXPECT_TRUE(schema_matches(R"({"items":[{"type":"integer"}],"additionalItems":false,"minItems":1})", "[1]"));
  EXPECT_FALSE(schema_matches(R"({"items":[{"type":"integer"}],"additionalItems":false})", "[1,2]"));
  EXPECT_TRUE(schema_matches(R"({"enum":[6,"foo",[],true,{"foo":12}]})", R"({"foo":12})"));
  EXPECT_FALSE(schema_matches(R"({"enum":[6,"foo",[],true,{"foo":12}]})", R"({"foo":false})"));
}

TEST(JsonSchema, RefusesUnenforceableKeywordsByName) {
  EXPECT_EQ(refused_keyword(R"({"type":"array","uniqueItems":true})"), "uniqueItems");
  EXPECT_EQ(refused_keyword(R"({"patternProperties":{"^x":{}}})"), "patternProperties");
  EXPECT_EQ(refused_keyword(R"({"type":"string","format":"hostname"})"), "format");
  EXPECT_EQ(refused_keyword(R"({"$ref":"http://example.com/other.json"})"), "$ref");
  EXPECT_EQ(refused_keyword(R"({"oneOf":[{"type":"object","required":["a"]},{"type":"object","required":["b"]}]})"), "oneOf");
  EXPECT_EQ(refused_keyword(R"#({"type":"string","pattern":"(?=x)"})#"), "pattern");
  EXPECT_EQ(refused_keyword(R"({"type":"integer","minimum":5,"maximum":4})"), "grammar");  // nothing satisfies it
  EXPECT_EQ(refused_keyword(R"({"type":"object","properties":{"a":{"type":"string","description":"x"}}})"), "");
}

// A vocabulary of every single byte plus multi-byte pieces typical of JSON, and one special stop token.
std::shared_ptr<const Vocabulary> test_vocabulary() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"{\"", "\":", "\",", "\"}", ", \"", "},", "}]", "[{", "true", "false", "null", "na",
                            "name", "\"name\"", "age", "12", "3.", "e+", "\":\"", "\\n", "\\u00", "é", "\xC3",
                            "\xA9\"", "ab", "abc", "\", \"", "1,", "0}", "-1", " ", "  ", "\"a", "x\"", "[]", "{}", "1,2,3", ",4,", ", 5, "})
    tokens.push_back(piece);
  tokens.push_back("<|end|>");
  return Vocabulary::from_tokens(tokens, {static_cast<TokenId>(tokens.size() - 1)});
}

// Walks random allowed tokens; at each step every token's mask bit must equal a fresh walk's verdict.
void check_masks_against_brute_force(const Grammar& grammar, int paths, uint32_t seed) {
  auto vocabulary = test_vocabulary();
  TokenId stop = vocabulary->size() - 1;
  auto compiled = compile(grammar, vocabulary, {stop});
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(vocabulary->mask_words());
  for (int path = 0; path < paths; ++path) {
    GrammarMatcher matcher(compiled);
    for (int step = 0; step < 60 && !matcher.terminated(); ++step) {
      matcher.fill_next_token_mask(mask);
      std::vector<TokenId> allowed;
      for (TokenId t = 0; t < vocabulary->size(); ++t) {
        bool bit = (mask[t >> 5] >> (t & 31)) & 1;
        bool accepted = matcher.accept_token(t);
        if (accepted) matcher.rollback(1);
        ASSERT_EQ(bit, accepted) << "token " << t << " '" << vocabulary->bytes(t) << "' at step " << step;
        if (accepted) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << "a dead end at step " << step;
      ASSERT_TRUE(matcher.accept_token(allowed[rng() % allowed.size()]));
    }
  }
}

TEST(TokenMask, EqualsBruteForceOnJsonSchema) {
  JsonSchemaOptions options;
  check_masks_against_brute_force(json_schema_grammar(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":6},"age":{"type":"integer","minimum":0},
      "tags":{"type":"array","items":{"enum":["a","abc",null]},"maxItems":3},
      "nested":{"anyOf":[{"type":"null"},{"$ref":"#"}]}},"required":["name"]})", options), 40, 1);
}

// Counted strings and repetitions near their bounds: the masks filter the precomputed tokens by what they need.
TEST(TokenMask, EqualsBruteForceNearCountedBounds) {
  check_masks_against_brute_force(json_schema_grammar(R"({"type":"object","properties":{
      "a":{"type":"string","minLength":20,"maxLength":23},"b":{"type":"string","maxLength":25,"pattern":"^[a-c]+$"},
      "c":{"type":"string","maxLength":2},"d":{"type":"string","pattern":"^(ab|c|na){17,19}$"},
      "e":{"type":"string","format":"email"}},"required":["a","b","c","d","e"],"additionalProperties":false})"), 40, 4);
  check_masks_against_brute_force(regex_grammar("(ab|c|\"){18,20}(na|me){0,30}"), 40, 5);
  // Counted items: tokens that read several separators (`,1,2`) need as many counts.
  check_masks_against_brute_force(json_schema_grammar(R"({"type":"object","properties":{
      "a":{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":17,"maxItems":19},
      "b":{"type":"array","items":{"type":"array","items":{"enum":["a",1]},"maxItems":18},"minItems":1,"maxItems":17}},
      "required":["a","b"],"additionalProperties":false})"), 40, 6);
}

// The vocabulary of the leaving-token tests: every single byte, runs of 2 to 24 letters a, and `pieces`.
std::shared_ptr<const Vocabulary> leaving_vocabulary(std::initializer_list<const char*> pieces) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (int length = 2; length <= 24; ++length) tokens.push_back(std::string(length, 'a'));
  for (const char* piece : pieces) tokens.push_back(piece);
  tokens.push_back("<|end|>");
  return Vocabulary::from_tokens(tokens, {static_cast<TokenId>(tokens.size() - 1)});
}

// After `prefix` and after each of `steps` more copies of `step`, every token's mask bit equals whether the matcher
// takes it (the brute-force verdict).
void expect_masks_along(const Grammar& grammar, const std::shared_ptr<const Vocabulary>& vocabulary,
                        std::string_view prefix, std::string_view step, int steps) {
  const auto compiled = compile(grammar, vocabulary, {vocabulary->size() - 1});
  std::vector<uint32_t> mask(vocabulary->mask_words());
  GrammarMatcher matcher(compiled);
  ASSERT_TRUE(prefix.empty() || matcher.accept_bytes(prefix));
  for (int at = 0; at <= steps; ++at) {
    if (at > 0) {
      ASSERT_TRUE(matcher.accept_bytes(step)) << at;
    }
    matcher.fill_next_token_mask(mask);
    for (TokenId t = 0; t < vocabulary->size(); ++t) {
      const bool bit = (mask[t >> 5] >> (t & 31)) & 1;
      const bool accepted = matcher.accept_token(t);
      if (accepted) matcher.rollback(1);
      ASSERT_EQ(bit, accepted) << "token '" << vocabulary->bytes(t) << "' after '" << prefix << "' and " << at << " x '"
                               << step << "'";
    }
  }
}

// A token read inside a counted repetition that may also end it (`Ja` in email's label: J as the repetition's last
// character and a after it) is allowed where its need is over the budget, since its path past the end fits: at every
// label length the mask equals the brute-force verdict, tokens of two and three letters included.
TEST(TokenMask, TokensLeavingACountedRepetitionNearItsBound) {
  const auto vocabulary = leaving_vocabulary({"Ja", "a.", "a-", "-a", "a.x", "aa.x"});
  expect_masks_along(regex_grammar("[A-Za-z]([A-Za-z-]{0,20}[A-Za-z])?\\.x"), vocabulary, "", "a", 22);
}

// Where a leaving token's rest is settled at compile time and where it is not: the rest read by the rule the frame
// returns to (sure: set without a walk; dead: dropped), by the rule above it (the frame's rule ends with the
// repetition: walked through the real stack), by return states that disagree (two call sites of twin repetitions:
// walked), and a frame still under its minimum (a leaving point with too few counts fails: walked).
TEST(TokenMask, LeavingTokensSureDeadOrWalkedNearACountedBound) {
  const auto vocabulary = leaving_vocabulary({"ab", "aab", "aaab", "ba", "aabaaaaaaaaa", "aaaaaaabaaaaa", "aa.", "aaa."});
  // The rest after the repetition is one letter and a dot: longer rests die in the returning rule.
  expect_masks_along(regex_grammar("[a-z]{0,20}[a-z]\\."), vocabulary, "", "a", 21);
  // `word` ends with its repetition, so what reads the rest is root's [a-z]*, past the returning rule.
  expect_masks_along(ebnf_grammar("root ::= word [a-z]* \".\"\nword ::= \"w\" [a-z]{0,20}"), vocabulary, "w", "a", 26);
  // The same where the rule above takes only a dot in one context: the walk through the real stack refuses letters.
  const Grammar contexts = ebnf_grammar("root ::= word [a-z] \".\" | \"v\" word \".\"\nword ::= \"w\" [a-z]{0,20}");
  expect_masks_along(contexts, vocabulary, "vw", "a", 20);
  expect_masks_along(contexts, vocabulary, "w", "a", 21);
  // A repetition inside a counted repetition's body.
  expect_masks_along(ebnf_grammar("root ::= (\"x\" [a-z]{0,20} [a-z] \";\"){1,20} \".\""), vocabulary, "x", "a", 21);
  // Twin repetitions returning to rules that take one letter or two after them.
  expect_masks_along(regex_grammar("y[a-z]{0,20}[a-z]\\.|z[a-z]{0,20}[a-z][a-z]\\."), vocabulary, "z", "a", 22);
  expect_masks_along(regex_grammar("y[a-z]{0,20}[a-z]\\.|z[a-z]{0,20}[a-z][a-z]\\."), vocabulary, "y", "a", 21);
  // Under the minimum of 17: `aab` + 9 letters after 10 letters may leave only before its b, at 12 counts, too few.
  expect_masks_along(regex_grammar("[a-z]{17,20}b[a-z]*\\."), vocabulary, "", "a", 20);
}

TEST(TokenMask, EqualsBruteForceOnAnyJsonAndEbnf) {
  check_masks_against_brute_force(any_json_grammar("object"), 40, 2);
  check_masks_against_brute_force(ebnf_grammar("root ::= (\"ab\" | \"a\" \"bc\"?) (\", \" [0-9]+)* \"}\""), 30, 3);
}

TEST(Matcher, RollbackJumpForwardAndStop) {
  auto vocabulary = test_vocabulary();
  TokenId stop = vocabulary->size() - 1;
  auto compiled = compile(json_schema_grammar(R"({"type":"object","properties":{"name":{"const":"abc"}},
      "required":["name"],"additionalProperties":false})"), vocabulary, {stop});
  GrammarMatcher matcher(compiled);
  EXPECT_EQ(matcher.jump_forward_bytes(), "{\"name\":");  // the space after ':' is optional: a choice
  EXPECT_TRUE(matcher.accept_bytes("{\"name\": \"abc\""));
  EXPECT_FALSE(matcher.accept_token(stop));
  EXPECT_EQ(matcher.jump_forward_bytes(), "}");
  EXPECT_TRUE(matcher.accept_bytes("}"));
  EXPECT_TRUE(matcher.can_end());
  EXPECT_TRUE(matcher.accept_token(stop));
  EXPECT_TRUE(matcher.terminated());
  matcher.rollback(2);
  EXPECT_FALSE(matcher.terminated());
  EXPECT_FALSE(matcher.accept_bytes("]"));
  EXPECT_TRUE(matcher.accept_bytes("}"));
}

}  // namespace
}  // namespace beamline
