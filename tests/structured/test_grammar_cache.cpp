// GrammarCache: a hit returns the compiled grammar without building it again, the least recently used entry goes
// first when the cache is full, a failed compile caches nothing, and the plain and Harmony vocabularies are separate.
#include <gtest/gtest.h>

#include "../harmony/harmony_fake_tokenizer.h"
#include "structured/grammar_cache.h"
#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"

namespace beamline {
namespace {

TEST(GrammarCache, LeastRecentlyUsedBoundedAndKeyed) {
  const harmony::testing::ByteTokenizer tokenizer;
  GrammarCache cache(tokenizer, 2);
  int builds = 0;
  auto get = [&](const std::string& choice) {
    return cache.get("choice\n" + choice, GrammarVocabulary::kPlain, [&] {
      ++builds;
      return choice_grammar({choice});
    }, {});
  };
  const auto a = get("a");
  EXPECT_EQ(get("a"), a);  // hit: the same object, not rebuilt
  EXPECT_EQ(builds, 1);
  get("b");
  get("a");                // a is now the most recent
  get("c");                // evicts b
  EXPECT_EQ(builds, 3);
  get("a");
  EXPECT_EQ(builds, 3);
  get("b");
  EXPECT_EQ(builds, 4);
  EXPECT_EQ(cache.counters().size, 2u);
  EXPECT_EQ(cache.counters().hits, 3u);

  EXPECT_THROW(cache.get("bad", GrammarVocabulary::kPlain, [] { return json_schema_grammar(R"({"uniqueItems": true,
                 "type": "array"})"); }, {}), UnsupportedGrammar);
  EXPECT_EQ(cache.counters().size, 2u);

  // The same key on the Harmony vocabulary is another entry, whose special tokens are grammar bytes.
  const auto harmony = cache.get("choice\na", GrammarVocabulary::kHarmony, [] { return choice_grammar({"a"}); }, {});
  EXPECT_NE(harmony, a);
  const TokenId start = *tokenizer.token_to_id("<|start|>");
  EXPECT_EQ(harmony->vocabulary()->bytes(start), std::string(1, static_cast<char>(harmony_byte("<|start|>"))));
  EXPECT_TRUE(a->vocabulary()->is_special(start));
}

}  // namespace
}  // namespace beamline
