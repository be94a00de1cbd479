// The verification rule of one draft row: accepted exactly when the acceptance draw is below the target's
// probability of the draft, and a rejected row draws from the target's distribution without the draft token, so
// the token that comes out is distributed as the target's (checked over a fine grid of both draws).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "spec/draft_verification.h"

namespace beamline {
namespace {

std::vector<float> random_logits(std::mt19937& rng, int32_t vocab) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// The target's sampling distribution, as sample_row draws it: the inverse CDF over a fine grid of uniforms.
std::vector<double> target_distribution(const std::vector<float>& logits, SampleRow row, int grid) {
  std::vector<double> p(logits.size(), 0.0);
  for (int i = 0; i < grid; ++i) {
    row.uniform = (i + 0.5) / grid;
    p[sample_row(logits, logits, row).token] += 1.0 / grid;
  }
  return p;
}

TEST(DraftVerification, OutputIsDistributedAsTheTarget) {
  std::mt19937 rng(11);
  constexpr int kGrid = 4000;
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t vocab = 3 + static_cast<int32_t>(rng() % 20);
    const std::vector<float> logits = random_logits(rng, vocab);
    SampleRow row;
    row.temperature = 0.5f + static_cast<float>(rng() % 100) / 50.0f;
    row.top_p = trial % 2 ? 0.8f : 1.0f;
    row.top_k = trial % 3 == 0 ? 4 : 0;
    row.min_p = trial % 5 == 0 ? 0.05f : 0.0f;
    const std::vector<double> p = target_distribution(logits, row, kGrid);
    const int32_t draft = static_cast<int32_t>(rng() % vocab);
    const double p_draft = target_probability(logits, row, draft);
    EXPECT_NEAR(p_draft, p[draft], 2.0 / kGrid);
    // Both draws over a grid: the acceptance draw's cells and, for rejections, the residual's.
    std::vector<double> out(vocab, 0.0);
    constexpr int kAcceptGrid = 200;
    for (int a = 0; a < kAcceptGrid; ++a) {
      row.uniform = (a + 0.5) / kAcceptGrid;
      const bool accepted = verify_draft_token(logits, row, draft, 0.5).token == draft;
      EXPECT_EQ(accepted, row.uniform < p_draft || p_draft >= 1.0) << "trial " << trial;
    }
    row.uniform = 1.0 - 1e-12;  // rejects unless the draft holds all the mass
    for (int r = 0; r < kGrid && p_draft < 1.0; ++r) {
      const int32_t token = verify_draft_token(logits, row, draft, (r + 0.5) / kGrid).token;
      ASSERT_NE(token, draft);
      out[token] += (1.0 - p_draft) / kGrid;
    }
    out[draft] += p_draft;
    for (int32_t t = 0; t < vocab; ++t) EXPECT_NEAR(out[t], p[t], 3.0 / kGrid) << "trial " << trial << " token " << t;
  }
}

TEST(DraftVerification, LogprobsAreTheRawRowsAndTheHookReplacesAcceptance) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 3.0f};
  SampleRow row;
  row.num_logprobs = 2;
  row.uniform = 0.9;
  const double p_draft = target_probability(logits, row, 1);
  ASSERT_LT(p_draft, 0.9);
  const SampledToken rejected = verify_draft_token(logits, row, 1, 0.3);
  EXPECT_NE(rejected.token, 1);
  ASSERT_TRUE(rejected.logprob);
  EXPECT_EQ(rejected.logprob->token, rejected.token);
  EXPECT_EQ(rejected.logprob->top.size(), 2u);
  const SampledToken forced = verify_draft_token(logits, row, 1, 0.3, [](double) { return 1.0; });
  EXPECT_EQ(forced.token, 1);
  EXPECT_NEAR(forced.logprob->logprob, std::log(p_draft), 1e-5);
}

}  // namespace
}  // namespace beamline
