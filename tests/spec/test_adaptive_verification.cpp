// Adaptive verification (spec/adaptive_verification.h): the choice maximises expected tokens per second over every
// allocation of drafts (brute force), it skips drafting where drafted steps cost more than they win and drafts in full
// where verify rows are nearly free, the drafter's confidence is calibrated from what was accepted, and over a
// simulated workload it is never slower than the better of "never draft" and "always draft K" by more than its
// exploration costs, and faster than both where the best k lies between.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "spec/adaptive_verification.h"

namespace beamline {
namespace {

using Candidate = AdaptiveVerification::Candidate;

// Measures every entry of the bucket of `decoding` sequences twice with cost(per_sequence).
void measure_all(AdaptiveVerification& policy, int32_t decoding, int32_t k,
                 const std::function<double(int32_t)>& cost) {
  for (int32_t per = 0; per <= k; ++per)
    for (int repeat = 0; repeat < 2; ++repeat)
      policy.record_step(decoding, per * decoding, per > 0, cost(per));
}

// Expected tokens of an allocation: each sequence 1 + sum_j prod_{m<=j} a_m.
double expected_tokens(const std::vector<std::vector<double>>& acceptance, const std::vector<int32_t>& counts) {
  double tokens = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    double reach = 1.0;
    tokens += 1.0;
    for (int32_t j = 0; j < counts[i]; ++j) tokens += reach *= acceptance[i][static_cast<std::size_t>(j)];
  }
  return tokens;
}

// A random step: a cost table measured into `policy` (1 plus a random convex-or-not increment per drafted token per
// sequence) and per sequence `room(rng)` drafts with random confidences, their acceptances under the policy.
struct RandomStep {
  std::vector<double> cost{1.0};
  std::vector<std::vector<float>> confidence;
  std::vector<std::vector<double>> acceptance;
  std::vector<Candidate> candidates;
};
RandomStep random_step(AdaptiveVerification& policy, std::mt19937& rng, int32_t sequences, int32_t k,
                       const std::function<int32_t()>& room) {
  std::uniform_real_distribution<float> uniform(0.02f, 0.98f);
  RandomStep step;
  for (int32_t per = 1; per <= k; ++per) step.cost.push_back(step.cost.back() + 0.05 + 0.6 * uniform(rng));
  measure_all(policy, sequences, k, [&](int32_t per) { return step.cost[static_cast<std::size_t>(per)]; });
  step.confidence.resize(static_cast<std::size_t>(sequences));
  step.acceptance.resize(static_cast<std::size_t>(sequences));
  for (std::size_t s = 0; s < step.confidence.size(); ++s) {
    const int32_t drafts = room();
    for (int32_t j = 0; j < drafts; ++j) step.confidence[s].push_back(uniform(rng));
    for (const float c : step.confidence[s]) step.acceptance[s].push_back(policy.acceptance(0, c));
  }
  for (const std::vector<float>& own : step.confidence) step.candidates.push_back({static_cast<int32_t>(own.size()), own});
  return step;
}

TEST(AdaptiveVerification, ChoosesTheBestAllocationOfDrafts) {
  std::mt19937 rng(7);
  constexpr int32_t kK = 3, kSequences = 3;
  for (int trial = 0; trial < 200; ++trial) {
    AdaptiveVerification policy(kK);
    const RandomStep step =
        random_step(policy, rng, kSequences, kK, [&] { return static_cast<int32_t>(rng() % (kK + 1)); });
    const auto& [cost, confidence, acceptance, candidates] = step;
    const std::vector<int32_t> chosen = policy.choose(kSequences, candidates, false);
    auto rate = [&](const std::vector<int32_t>& counts) {
      int32_t n = 0;
      for (const int32_t c : counts) n += c;
      return expected_tokens(acceptance, counts) / cost[static_cast<std::size_t>((n + kSequences - 1) / kSequences)];
    };
    // Every allocation within the rooms.
    double best = 0;
    std::vector<int32_t> counts(kSequences, 0);
    std::function<void(int32_t)> visit = [&](int32_t s) {
      if (s == kSequences) {
        best = std::max(best, rate(counts));
        return;
      }
      for (int32_t c = 0; c <= static_cast<int32_t>(confidence[static_cast<std::size_t>(s)].size()); ++c) {
        counts[static_cast<std::size_t>(s)] = c;
        visit(s + 1);
      }
    };
    visit(0);
    for (int32_t s = 0; s < kSequences; ++s)
      ASSERT_LE(chosen[static_cast<std::size_t>(s)], static_cast<int32_t>(confidence[static_cast<std::size_t>(s)].size()));
    // The best allocation, or every draft on offer when that is within the margin of the best.
    std::vector<int32_t> full;
    for (const std::vector<float>& own : confidence) full.push_back(static_cast<int32_t>(own.size()));
    const double full_rate = rate(full);
    if (best < full_rate * (1 + AdaptiveVerification::kFullDraftMargin)) {
      EXPECT_EQ(chosen, full) << "trial " << trial;
    } else {
      EXPECT_NEAR(rate(chosen), best, 1e-9 * best) << "trial " << trial;
    }
  }
}

// Uniform (a runner with decode graphs): every sequence verifies the same k, or all its drafts when it has fewer, and
// that k is the best of every k (brute force), even where unequal counts would score higher on the cost table.
TEST(AdaptiveVerification, UniformVerifiesTheSameKEverywhereAndTheBestK) {
  std::mt19937 rng(8);
  constexpr int32_t kK = 5, kSequences = 4;
  for (int trial = 0; trial < 200; ++trial) {
    AdaptiveVerification policy(kK, true);
    // Most sequences have room for all K; now and then one has less.
    const RandomStep step = random_step(policy, rng, kSequences, kK, [&] {
      return rng() % 4 == 0 ? static_cast<int32_t>(rng() % (kK + 1)) : kK;
    });
    const auto& [cost, confidence, acceptance, candidates] = step;
    const bool drafted = trial % 2 == 1;
    const std::vector<int32_t> chosen = policy.choose(kSequences, candidates, drafted);
    auto counts_of = [&](int32_t k) {
      std::vector<int32_t> counts;
      for (const std::vector<float>& own : confidence) counts.push_back(std::min(k, static_cast<int32_t>(own.size())));
      return counts;
    };
    double best = 0;
    int32_t best_k = 0;
    for (int32_t k = drafted ? 1 : 0; k <= kK; ++k) {
      const double rate = expected_tokens(acceptance, counts_of(k)) / cost[static_cast<std::size_t>(k)];
      if (rate > best) {
        best = rate;
        best_k = k;
      }
    }
    // K unless the best k beats it by the margin.
    const double full_rate = expected_tokens(acceptance, counts_of(kK)) / cost[kK];
    if (best < full_rate * (1 + AdaptiveVerification::kFullDraftMargin)) best_k = kK;
    EXPECT_EQ(chosen, counts_of(best_k)) << "trial " << trial;
  }
}

TEST(AdaptiveVerification, SkipsDraftsThatDoNotPayAndDraftsInFullWhereRowsAreFree) {
  const std::vector<float> sure(7, 0.95f);
  const std::vector<Candidate> sixteen(16, Candidate{7, {}});
  // Rows nearly free (bandwidth-bound decode): draft all seven.
  AdaptiveVerification cheap(7);
  measure_all(cheap, 16, 7, [](int32_t per) { return 1.0 + 0.01 * per; });
  for (int i = 0; i < 50; ++i) cheap.record_verification(sure, 7, 7);
  EXPECT_TRUE(cheap.should_draft(16, sixteen));
  const std::vector<Candidate> confident(16, Candidate{7, sure});
  for (const int32_t k : cheap.choose(16, confident, true)) EXPECT_EQ(k, 7);
  // A drafted step ten times a plain one, whatever its drafts: no drafting (and so no drafter pass).
  AdaptiveVerification costly(7);
  measure_all(costly, 16, 7, [](int32_t per) { return per == 0 ? 1.0 : 10.0; });
  for (int i = 0; i < 50; ++i) costly.record_verification(sure, 7, 7);
  EXPECT_FALSE(costly.should_draft(16, sixteen));
  // Unsure drafts on expensive rows: none or few.
  AdaptiveVerification unsure(7);
  measure_all(unsure, 1, 7, [](int32_t per) { return 1.0 + 0.5 * per; });
  const std::vector<float> doubtful(7, 0.1f);
  const std::vector<Candidate> one{{7, doubtful}};
  EXPECT_EQ(unsure.choose(1, one, false)[0], 0);
  EXPECT_EQ(unsure.choose(1, one, true)[0], 1);  // the drafter ran: at least one token is verified
}

// A runner with decode graphs: steps without prompt rows replay one (a plain step 1.0, a drafted one 1.6), steps that
// carry prompt rows run op by op whether they draft or not (plain 8.4, drafted 9.0: the H200's batch-64 figures,
// bench/results/2026-12-03-spec15.md). Each kind is priced from its own table, so with drafts accepted at ~0.86 both
// kinds draft in full. Priced from one table, as before, the drafted steps (mostly carrying prompts) looked 9x a
// plain one and the choice went plain, into op-by-op plain steps.
TEST(AdaptiveVerification, PricesStepsWithPromptRowsFromTheirOwnTable) {
  const std::vector<float> likely(7, 0.86f);
  const std::vector<Candidate> unknown(64, Candidate{7, {}}), confident(64, Candidate{7, likely});
  AdaptiveVerification policy(7, true);
  for (int i = 0; i < 200; ++i) policy.record_verification(likely, 7, i % 7 == 0 ? 3 : 7);
  measure_all(policy, 64, 7, [](int32_t per) { return per == 0 ? 1.0 : 1.6; });
  // Nothing measured with prompt rows yet: drafted steps first (fixed K), then plain ones, as for any bucket.
  EXPECT_TRUE(policy.should_draft(64, unknown, true));
  for (int i = 0; i < 2; ++i) policy.record_step(64, 7 * 64, true, 9.0, true);
  EXPECT_FALSE(policy.should_draft(64, unknown, true));
  for (int i = 0; i < 2; ++i) policy.record_step(64, 0, false, 8.4, true);
  EXPECT_NEAR(*policy.step_seconds(64, 0, true), 8.4, 1e-12);
  EXPECT_NEAR(*policy.step_seconds(64, 0, false), 1.0, 1e-12);
  EXPECT_NEAR(*policy.step_seconds(64, 7, true), 9.0, 1e-12);
  for (const bool prompt_rows : {false, true}) {
    EXPECT_TRUE(policy.should_draft(64, unknown, prompt_rows)) << "prompt rows " << prompt_rows;
    for (const int32_t k : policy.choose(64, confident, true, prompt_rows)) EXPECT_EQ(k, 7);
  }

  AdaptiveVerification one_table(7, true);
  for (int i = 0; i < 200; ++i) one_table.record_verification(likely, 7, i % 7 == 0 ? 3 : 7);
  measure_all(one_table, 64, 7, [](int32_t per) { return per == 0 ? 1.0 : 9.0; });
  EXPECT_FALSE(one_table.should_draft(64, unknown)) << "the mispricing this table split removes";
}

// Estimates within their noise of each other never make adaptive verification slower than fixed K: a plan with fewer
// drafts is taken only when it beats verifying every draft by kFullDraftMargin.
TEST(AdaptiveVerification, VerifiesEveryDraftUnlessAnotherPlanIsClearlyFaster) {
  const std::vector<float> likely(7, 0.9f);
  const std::vector<Candidate> sixteen(16, Candidate{7, likely});
  // Cost 1 + c k per step: the best k falls below 7 as c grows; its margin over k = 7 grows with it.
  auto margin_of_best = [&](double c, int32_t* best_k) {
    double best = 0, full = 0, tokens = 1, reach = 1;
    for (int32_t k = 0; k <= 7; ++k) {
      if (k > 0) tokens += reach *= 0.9;
      const double rate = tokens / (1 + c * k);
      if (k == 7) full = rate;
      if (rate > best) {
        best = rate;
        *best_k = k;
      }
    }
    return best / full - 1;
  };
  int32_t close_k = 0, clear_k = 0;
  ASSERT_GT(margin_of_best(0.3, &close_k), 0.0);
  ASSERT_LT(margin_of_best(0.3, &close_k), AdaptiveVerification::kFullDraftMargin);
  ASSERT_LT(close_k, 7);
  ASSERT_GT(margin_of_best(0.6, &clear_k), AdaptiveVerification::kFullDraftMargin);
  ASSERT_GT(clear_k, 0);
  for (const auto& [c, expected] : {std::pair{0.3, 7}, std::pair{0.6, clear_k}}) {
    AdaptiveVerification policy(7, true);
    measure_all(policy, 16, 7, [c = c](int32_t per) { return 1 + c * per; });
    for (const int32_t k : policy.choose(16, sixteen, true)) EXPECT_EQ(k, expected) << "c " << c;
  }
}

TEST(AdaptiveVerification, ExploresUnmeasuredStepsFirstThenTheLosingKindLessAndLessOften) {
  AdaptiveVerification policy(4);
  const std::vector<Candidate> four(4, Candidate{4, {}});
  auto plain = [](int32_t) { return 1.0; };
  auto drafted = [](int32_t) { return 20.0; };
  // Nothing measured: draft (twice: an entry is known from its second sample), then plain steps.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(policy.should_draft(4, four));
    policy.record_step(4, 16, true, drafted(4));
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_FALSE(policy.should_draft(4, four));
    policy.record_step(4, 0, false, plain(0));
  }
  EXPECT_NEAR(*policy.step_seconds(4, 4), 20.0, 1e-12);
  EXPECT_NEAR(*policy.step_seconds(4, 0), 1.0, 1e-12);
  // Plain wins; drafted steps are measured again after 16, 32, 64, ... steps.
  std::vector<int> explored;
  for (int step = 0; step < 1000; ++step) {
    if (policy.should_draft(4, four)) {
      explored.push_back(step);
      policy.record_step(4, 16, true, drafted(4));
    } else {
      policy.record_step(4, 0, false, plain(0));
    }
  }
  ASSERT_GE(explored.size(), 3u);
  EXPECT_LE(explored.size(), 8u);
  for (std::size_t i = 2; i < explored.size(); ++i)
    EXPECT_GT(explored[i] - explored[i - 1], explored[i - 1] - explored[i - 2]) << "exploration should slow down";
}

TEST(AdaptiveVerification, CalibratesTheDraftersConfidence) {
  AdaptiveVerification policy(7);
  EXPECT_NEAR(policy.acceptance(0, 0.85f), 0.85, 1e-6);  // before any evidence: the confidence itself
  // An over-confident drafter: its 0.85s are accepted 30% of the time.
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i) {
    const std::vector<float> confidence{0.85f};
    policy.record_verification(confidence, 1, rng() % 10 < 3 ? 1 : 0);
  }
  EXPECT_NEAR(policy.acceptance(0, 0.85f), 0.3, 0.05);
  // Without confidences: the running rate of each position, conditional on the ones before.
  AdaptiveVerification positions(7);
  EXPECT_NEAR(positions.acceptance(3, std::nullopt), 0.5, 1e-12);  // the prior
  for (int i = 0; i < 3000; ++i) positions.record_verification({}, 4, i % 2 == 0 ? 4 : 1);
  EXPECT_NEAR(positions.acceptance(0, std::nullopt), 1.0, 0.01);
  EXPECT_NEAR(positions.acceptance(1, std::nullopt), 0.5, 0.02);
  EXPECT_NEAR(positions.acceptance(2, std::nullopt), 1.0, 0.01);
}

// A simulated server: D sequences decode; a step with n drafts costs t(D, n) and each draft position is accepted
// with probability a (independent per position, given the ones before). Tokens per second over 3000 steps.
struct Workload {
  int32_t decoding;
  double acceptance;
  std::function<double(int32_t decoding, int32_t drafts, bool drafter_ran)> seconds;
};

enum class Mode { Never, AlwaysK, Adaptive };

double simulate(const Workload& w, int32_t k, Mode mode) {
  std::mt19937 rng(11);
  std::bernoulli_distribution accept(w.acceptance);
  AdaptiveVerification policy(k);
  const std::vector<Candidate> candidates(static_cast<std::size_t>(w.decoding), Candidate{k, {}});
  double tokens = 0, seconds = 0;
  for (int step = 0; step < 3000; ++step) {
    std::vector<int32_t> counts(static_cast<std::size_t>(w.decoding), 0);
    bool drafted = false;
    if (mode == Mode::AlwaysK || (mode == Mode::Adaptive && policy.should_draft(w.decoding, candidates))) {
      drafted = true;
      counts = mode == Mode::AlwaysK ? std::vector<int32_t>(counts.size(), k)
                                     : policy.choose(w.decoding, candidates, true);
    }
    int32_t n = 0;
    for (const int32_t c : counts) {
      n += c;
      int32_t accepted = 0;
      while (accepted < c && accept(rng)) ++accepted;
      tokens += 1 + accepted;
      if (c > 0) policy.record_verification({}, c, accepted);
    }
    const double t = w.seconds(w.decoding, n, drafted);
    seconds += t;
    policy.record_step(w.decoding, n, drafted, t);
  }
  return tokens / seconds;
}

TEST(AdaptiveVerification, NeverSlowerThanNoSpeculationAndBeatsFixedK) {
  // Launch-bound small batch: rows are free, the drafter pass costs a third of a step. Large batch: a drafted step
  // costs several plain ones. Medium: each verified row costs something, so the best k lies between 0 and K.
  const Workload workloads[] = {
      {1, 0.9, [](int32_t, int32_t n, bool ran) { return 1.0 + (ran ? 0.3 : 0.0) + 0.002 * n; }},
      {16, 0.85, [](int32_t, int32_t n, bool ran) { return 2.6 + (ran ? 6.0 : 0.0) + 0.12 * n; }},
      {64, 0.7, [](int32_t, int32_t n, bool ran) { return 4.0 + (ran ? 0.3 : 0.0) + 0.01 * n; }},
  };
  for (const Workload& w : workloads) {
    const double never = simulate(w, 7, Mode::Never), always = simulate(w, 7, Mode::AlwaysK),
                 adaptive = simulate(w, 7, Mode::Adaptive);
    std::printf("batch %d, acceptance %.2f: tokens/s never %.3f, K=7 %.3f, adaptive %.3f\n", w.decoding, w.acceptance,
                never, always, adaptive);
    EXPECT_GE(adaptive, 0.97 * never) << "batch " << w.decoding;
    EXPECT_GE(adaptive, 0.97 * always) << "batch " << w.decoding;
  }
  // Where the best k lies between: adaptive beats both ends by a margin.
  const Workload& medium = workloads[2];
  EXPECT_GT(simulate(medium, 7, Mode::Adaptive), 1.05 * std::max(simulate(medium, 7, Mode::Never),
                                                                  simulate(medium, 7, Mode::AlwaysK)));
}

}  // namespace
}  // namespace beamline
