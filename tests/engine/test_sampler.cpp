// Sampler transforms against naive versions on random logits, seeded reproducibility, logprobs, and the
// stop checker (stop strings across token boundaries, stop ids, eos, min/max tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "fake_tokenizer.h"

namespace beamline {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_logits(std::mt19937& rng, int n, float scale = 4.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<double> naive_softmax(const std::vector<float>& logits) {
  double m = -kInf;
  for (float l : logits) m = std::max(m, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::isinf(logits[i]) ? 0.0 : std::exp(logits[i] - m);
  for (double& x : p) x /= sum;
  return p;
}

std::set<int> kept(const std::vector<float>& logits) {
  std::set<int> s;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != -kInf) s.insert(static_cast<int>(i));
  }
  return s;
}

TEST(Sampler, TopKKeepsTheKBest) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = random_logits(rng, 1 + static_cast<int>(rng() % 300));
    const int k = 1 + static_cast<int>(rng() % (logits.size() + 3));
    auto sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    std::set<int> expected;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (k >= static_cast<int>(logits.size()) || logits[i] >= sorted[k - 1]) expected.insert(static_cast<int>(i));
    }
    auto got = logits;
    apply_top_k(got, k);
    EXPECT_EQ(kept(got), expected);
    for (int i : expected) EXPECT_EQ(got[i], logits[i]);
  }
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = trial % 3 == 0 ? 5000 : 1 + static_cast<int>(rng() % 200);
    auto logits = random_logits(rng, n, trial % 2 ? 0.5f : 3.0f);  // flat distributions need big nuclei
    if (trial % 5 == 0) logits[rng() % n] = -kInf;
    const float p = std::uniform_real_distribution<float>(0.05f, 0.999f)(rng);
    const auto probs = naive_softmax(logits);
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    std::set<int> expected;
    double cumulative = 0;
    for (int i : order) {
      if (cumulative >= p || logits[i] == -kInf) break;
      expected.insert(i);
      cumulative += probs[i];
    }
    auto got = logits;
    apply_top_p(got, p);
    EXPECT_EQ(kept(got), expected) << "n " << n << " p " << p;
  }
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = random_logits(rng, 1 + static_cast<int>(rng() % 300));
    const float min_p = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    const auto probs = naive_softmax(logits);
    const double best = *std::max_element(probs.begin(), probs.end());
    std::set<int> expected;
    for (std::size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] >= min_p * best) expected.insert(static_cast<int>(i));
    }
    auto got = logits;
    apply_min_p(got, min_p);
    EXPECT_EQ(kept(got), expected);
  }
}

TEST(Sampler, PenaltiesAndBiasMatchTheirDefinitions) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 40;
    SamplingParams params;
    params.repetition_penalty = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
    params.frequency_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    params.presence_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    params.logit_bias = {{3, 150.0f}, {7, -2.5f}};
    std::vector<TokenId> prompt, output;
    for (int i = 0; i < 15; ++i) prompt.push_back(static_cast<TokenId>(rng() % n));
    for (int i = 0; i < 15; ++i) output.push_back(static_cast<TokenId>(rng() % n));
    SamplerState state(1, prompt, params);
    for (TokenId t : output) state.record_output(t);

    auto logits = random_logits(rng, n);
    auto expected = logits;
    expected[3] += 100.0f;  // clamped
    expected[7] -= 2.5f;
    for (int t = 0; t < n; ++t) {
      const bool in_prompt = std::count(prompt.begin(), prompt.end(), t) > 0;
      const auto count = std::count(output.begin(), output.end(), t);
      if (in_prompt || count > 0) {
        expected[t] = expected[t] > 0 ? expected[t] / params.repetition_penalty : expected[t] * params.repetition_penalty;
      }
      expected[t] -= params.frequency_penalty * static_cast<float>(count) + (count > 0 ? params.presence_penalty : 0.0f);
    }
    apply_logit_bias(logits, params.logit_bias);
    apply_penalties(logits, params, state);
    for (int t = 0; t < n; ++t) EXPECT_NEAR(logits[t], expected[t], 1e-4f) << t;
  }
}

TEST(Sampler, DrawFollowsTheInverseCdfAndTheDistribution) {
  std::mt19937 rng(5);
  auto logits = random_logits(rng, 12, 1.0f);
  logits[4] = -kInf;
  const auto probs = naive_softmax(logits);
  for (double u = 0.0; u < 1.0; u += 0.013) {
    double cumulative = 0;
    int expected = 11;
    for (int i = 0; i < 12; ++i) {
      cumulative += probs[i];
      if (cumulative > u) {
        expected = i;
        break;
      }
    }
    EXPECT_EQ(draw_token(logits, u), expected) << u;
  }
  SamplingParams params;
  SamplerState state(99, {}, params);
  std::vector<int> counts(12, 0);
  const int draws = 60000;
  for (int i = 0; i < draws; ++i) ++counts[sample_token(logits, params, state, {}).token];
  EXPECT_EQ(counts[4], 0);
  for (int i = 0; i < 12; ++i) {
    const double sd = std::sqrt(draws * probs[i] * (1 - probs[i]));
    EXPECT_NEAR(counts[i], draws * probs[i], 5 * sd + 1) << i;
  }
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  std::mt19937 rng(6);
  auto logits = random_logits(rng, 100);
  SamplingParams params;
  params.temperature = 0.3f;
  params.top_k = 3;
  params.logprobs = 5;
  params.logit_bias = {{17, 50.0f}};
  SamplerState state(7, {}, params);
  const SampledToken sampled = sample_token(logits, params, state, {});
  EXPECT_EQ(sampled.token, 17) << "the bias decides the token";
  ASSERT_TRUE(sampled.logprob);
  double m = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (float l : logits) sum += std::exp(l - m);
  const double log_z = m + std::log(sum);
  EXPECT_NEAR(sampled.logprob->logprob, logits[17] - log_z, 1e-5);
  EXPECT_EQ(sampled.logprob->rank, 1 + std::count_if(logits.begin(), logits.end(), [&](float l) { return l > logits[17]; }));
  std::vector<int> order(100);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  ASSERT_EQ(sampled.logprob->top.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(sampled.logprob->top[i].first, order[i]);
    EXPECT_NEAR(sampled.logprob->top[i].second, logits[order[i]] - log_z, 1e-5);
  }
}

TEST(Sampler, GreedyTakesTheFirstMaximumAndSeedsReproduce) {
  std::vector<float> flat = {1.0f, 3.0f, 3.0f, 2.0f};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplerState state(0, {}, greedy);
  EXPECT_EQ(sample_token(flat, greedy, state, {}).token, 1);
  const std::vector<TokenId> masked = {1};
  EXPECT_EQ(sample_token(flat, greedy, state, masked).token, 2);

  std::mt19937 rng(8);
  SamplingParams params;
  params.temperature = 1.3f;
  params.top_p = 0.9f;
  auto run = [&](uint64_t seed) {
    SamplerState s(seed, {}, params);
    std::mt19937 logit_rng(9);
    std::vector<TokenId> out;
    for (int i = 0; i < 200; ++i) out.push_back(sample_token(random_logits(logit_rng, 30), params, s, {}).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  EXPECT_EQ(sample_seed(5, 2, 777), 7u);
  EXPECT_EQ(sample_seed(std::nullopt, 2, 777), 777u);
}

// ---- stop checker ----

testing::FakeTokenizer make_tokenizer() {
  // 0 eos (special), 1 "Hel", 2 "lo", 3 " wor", 4 "ld", 5 0xC3, 6 0xA9 (with 5: "é"), 7 "!", 8 "<|call|>" (special)
  return testing::FakeTokenizer({"<eos>", "Hel", "lo", " wor", "ld", "\xC3", "\xA9", "!", "<|call|>"}, {0, 8});
}

struct CheckerRun {
  std::string text;
  std::optional<FinishReason> finish;
  std::variant<std::monostate, TokenId, std::string> stop_reason;
  int tokens = 0;
};

CheckerRun run_checker(const Tokenizer& tok, const SamplingParams& params, const std::vector<TokenId>& ids, int max_tokens = 100) {
  const std::vector<TokenId> eos = {0};
  StopChecker checker(&tok, true, params, eos, max_tokens);
  CheckerRun run;
  for (TokenId id : ids) {
    ++run.tokens;
    auto result = checker.push(id, run.tokens);
    run.text += result.text;
    if (result.finish) {
      run.finish = result.finish;
      run.stop_reason = result.stop_reason;
      break;
    }
  }
  return run;
}

TEST(StopChecker, StopStringsMatchAcrossTokenBoundaries) {
  const auto tok = make_tokenizer();
  SamplingParams params;
  params.stop = {"lo wo"};
  CheckerRun run = run_checker(tok, params, {1, 2, 3, 4});
  EXPECT_EQ(run.tokens, 3);
  EXPECT_EQ(run.text, "Hel");
  EXPECT_EQ(run.finish, FinishReason::Stop);
  EXPECT_EQ(std::get<std::string>(run.stop_reason), "lo wo");
  params.include_stop_str_in_output = true;
  EXPECT_EQ(run_checker(tok, params, {1, 2, 3, 4}).text, "Hello wo");
  // A stop string inside a split character: "é!" spans three tokens.
  params.stop = {"\xC3\xA9!"};
  params.include_stop_str_in_output = false;
  run = run_checker(tok, params, {1, 5, 6, 7, 2});
  EXPECT_EQ(run.tokens, 4);
  EXPECT_EQ(run.text, "Hel");
}

TEST(StopChecker, StopIdsEosMaxTokensAndSpecialTokens) {
  const auto tok = make_tokenizer();
  SamplingParams params;
  CheckerRun run = run_checker(tok, params, {1, 2, 0, 3});
  EXPECT_EQ(run.text, "Hello");
  EXPECT_EQ(run.finish, FinishReason::Stop);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(run.stop_reason)) << "eos is not a stop_reason";
  params.ignore_eos = true;
  run = run_checker(tok, params, {1, 2, 0, 3}, 4);
  EXPECT_EQ(run.text, "Hello wor") << "eos is special: no text";
  EXPECT_EQ(run.finish, FinishReason::Length);
  params.ignore_eos = false;
  params.stop_token_ids = {8};
  run = run_checker(tok, params, {1, 8, 2});
  EXPECT_EQ(std::get<TokenId>(run.stop_reason), 8);
  EXPECT_EQ(run.text, "Hel");
  params.skip_special_tokens = false;
  params.stop_token_ids = {};
  EXPECT_EQ(run_checker(tok, params, {1, 8, 2}, 3).text, "Hel<|call|>lo");
  // Held-back text is released when the sample ends by length.
  params.stop = {"zzzz"};
  run = run_checker(tok, params, {1, 2, 3}, 3);
  EXPECT_EQ(run.text, "Hello wor");
  EXPECT_EQ(run.finish, FinishReason::Length);
}

TEST(StopChecker, MinTokensMasksEosAndStopIds) {
  const auto tok = make_tokenizer();
  SamplingParams params;
  params.min_tokens = 2;
  params.stop_token_ids = {8};
  const std::vector<TokenId> eos = {0};
  StopChecker checker(&tok, true, params, eos, 10);
  std::vector<TokenId> masked(checker.masked_tokens(0).begin(), checker.masked_tokens(0).end());
  std::sort(masked.begin(), masked.end());
  EXPECT_EQ(masked, (std::vector<TokenId>{0, 8}));
  EXPECT_EQ(checker.masked_tokens(1).size(), 2u);
  EXPECT_TRUE(checker.masked_tokens(2).empty());
}

TEST(StopChecker, RandomStopsMatchNaiveSearch) {
  std::mt19937 rng(10);
  std::vector<std::string> pieces = {"<eos>"};
  const std::string alphabet = "ab c";
  for (int i = 0; i < 30; ++i) {
    std::string piece;
    for (int j = 0, len = 1 + static_cast<int>(rng() % 3); j < len; ++j) piece += alphabet[rng() % alphabet.size()];
    pieces.push_back(piece);
  }
  const testing::FakeTokenizer tok(pieces, {0});
  for (int trial = 0; trial < 300; ++trial) {
    SamplingParams params;
    for (int s = 0, count = 1 + static_cast<int>(rng() % 3); s < count; ++s) {
      std::string stop;
      for (int j = 0, len = 1 + static_cast<int>(rng() % 5); j < len; ++j) stop += alphabet[rng() % alphabet.size()];
      params.stop.push_back(stop);
    }
    params.include_stop_str_in_output = rng() % 2;
    std::vector<TokenId> ids;
    for (int i = 0; i < 20; ++i) ids.push_back(1 + static_cast<TokenId>(rng() % 30));
    const CheckerRun run = run_checker(tok, params, ids, 20);
    // Naive: after each token, look for the earliest stop occurrence in the whole text.
    std::string text;
    std::string expected;
    int expected_tokens = 20;
    bool stopped = false;
    for (int i = 0; i < 20 && !stopped; ++i) {
      text += pieces[ids[i]];
      std::size_t best = std::string::npos, best_len = 0;
      for (const std::string& stop : params.stop) {
        const auto at = text.find(stop);
        if (at != std::string::npos && at < best) {
          best = at;
          best_len = stop.size();
        }
      }
      if (best != std::string::npos) {
        expected = text.substr(0, best + (params.include_stop_str_in_output ? best_len : 0));
        expected_tokens = i + 1;
        stopped = true;
      }
    }
    if (!stopped) expected = text;
    ASSERT_EQ(run.text, expected) << "trial " << trial;
    ASSERT_EQ(run.tokens, expected_tokens);
    ASSERT_EQ(run.finish, stopped ? FinishReason::Stop : FinishReason::Length);
  }
}

}  // namespace
}  // namespace beamline
