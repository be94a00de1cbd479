// The n-gram proposer against a brute-force statement of its rule.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "spec/ngram_proposer.h"

namespace beamline {
namespace {

// The rule, naively: for n from max_n down to min_n, the latest earlier occurrence of the last n tokens; the draft
// continues from there, reading its own tokens past the end of the context.
std::vector<int32_t> naive_draft(const std::vector<int32_t>& context, int32_t min_n, int32_t max_n, int32_t k) {
  const auto length = static_cast<int64_t>(context.size());
  for (int32_t n = max_n; n >= min_n; --n) {
    if (length < n + 1) continue;
    for (int64_t start = length - n - 1; start >= 0; --start) {
      bool match = true;
      for (int32_t i = 0; i < n && match; ++i) match = context[start + i] == context[length - n + i];
      if (!match) continue;
      std::vector<int32_t> extended = context;
      for (int32_t i = 0; i < k; ++i) extended.push_back(extended[start + n + i]);
      return {extended.begin() + length, extended.end()};
    }
  }
  return {};
}

TEST(NgramProposer, CopiesWhatFollowedTheLatestLongestMatch) {
  EXPECT_EQ(propose_ngram_draft(std::vector<int32_t>{1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3}, 1, 3, 2),
            (std::vector<int32_t>{5, 7}));  // "2 3" last occurred before 5 7
  EXPECT_EQ(propose_ngram_draft(std::vector<int32_t>{7, 1, 2, 8, 1, 2, 9, 0, 1, 2}, 2, 2, 3),
            (std::vector<int32_t>{9, 0, 1}));
  // A period shorter than k: the copy runs on into its own tokens.
  EXPECT_EQ(propose_ngram_draft(std::vector<int32_t>{5, 6, 5, 6}, 1, 2, 5), (std::vector<int32_t>{5, 6, 5, 6, 5}));
  EXPECT_TRUE(propose_ngram_draft(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(propose_ngram_draft(std::vector<int32_t>{1, 2, 9, 1, 2}, 3, 3, 4).empty());  // only 2 tokens recur
  EXPECT_TRUE(propose_ngram_draft(std::vector<int32_t>{4}, 1, 1, 4).empty());
}

TEST(NgramProposer, MatchesTheNaiveRuleOnRandomContexts) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> context(1 + rng() % 40);
    const int32_t vocab = 2 + static_cast<int32_t>(rng() % 6);
    for (int32_t& token : context) token = static_cast<int32_t>(rng() % vocab);
    const int32_t min_n = 1 + static_cast<int32_t>(rng() % 3), max_n = min_n + static_cast<int32_t>(rng() % 3);
    const int32_t k = 1 + static_cast<int32_t>(rng() % 6);
    ASSERT_EQ(propose_ngram_draft(context, min_n, max_n, k), naive_draft(context, min_n, max_n, k)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace beamline
