// --logprobs-mode on the host path: each mode's values against a naive computation on random rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/logprobs_mode.h"
#include "engine/sampler.h"
#include "util/error.h"

namespace beamline {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Temperature, then top_k, then top_p, the plain way: sort, keep a prefix.
std::vector<float> naive_processed(std::vector<float> values, float temperature, int32_t top_k, float top_p) {
  for (float& v : values) v /= temperature;
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  for (std::size_t i = static_cast<std::size_t>(top_k); i < order.size(); ++i) values[order[i]] = -kInf;
  double total = 0;
  for (float v : values) total += std::exp(static_cast<double>(v));
  double mass = 0;
  std::size_t kept = 0;
  while (kept < order.size() && mass < top_p * total) mass += std::exp(static_cast<double>(values[order[kept++]]));
  for (std::size_t i = kept; i < order.size(); ++i) values[order[i]] = -kInf;
  return values;
}

std::vector<float> naive_log_softmax(const std::vector<float>& values) {
  const float best = *std::max_element(values.begin(), values.end());
  double sum = 0;
  for (float v : values) sum += std::exp(static_cast<double>(v - best));
  std::vector<float> out;
  for (float v : values) out.push_back(static_cast<float>(v - best - std::log(sum)));
  return out;
}

TEST(LogprobsMode, EachModeReportsItsValuesForTheTokenAndTheBestAlternatives) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> raw(57);
    for (float& v : raw) v = normal(rng);
    std::vector<float> edited = raw;
    edited[3] += 5.0f;  // as a logit bias would
    SampleRow row;
    row.temperature = 0.7f;
    row.top_k = 12;
    row.top_p = 0.8f;
    row.num_logprobs = 4;
    const std::vector<float> processed = naive_processed(edited, row.temperature, row.top_k, row.top_p);
    const int32_t token = static_cast<int32_t>(std::max_element(processed.begin(), processed.end()) - processed.begin());
    const std::vector<std::pair<LogprobsMode, std::vector<float>>> expected = {
        {LogprobsMode::RawLogits, raw},
        {LogprobsMode::RawLogprobs, naive_log_softmax(raw)},
        {LogprobsMode::ProcessedLogits, processed},
        {LogprobsMode::ProcessedLogprobs, naive_log_softmax(processed)},
    };
    for (const auto& [mode, values] : expected) {
      SCOPED_TRACE(std::string(to_string(mode)));
      const TokenLogprob result = logprob_in_mode(raw, edited, row, token, mode);
      EXPECT_NEAR(result.logprob, values[token], 1e-4f);
      std::vector<int32_t> order(values.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
      EXPECT_EQ(result.rank, 1 + std::find(order.begin(), order.end(), token) - order.begin());
      ASSERT_EQ(result.top.size(), 4u);
      for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(result.top[i].first, order[i]);
        if (std::isinf(values[order[i]])) {
          EXPECT_EQ(result.top[i].second, values[order[i]]);
        } else {
          EXPECT_NEAR(result.top[i].second, values[order[i]], 1e-4f);
        }
      }
    }
  }
}

TEST(LogprobsMode, GreedyRowsAreProcessedByTheEditsOnly) {
  const std::vector<float> raw = {1.0f, 2.0f, 0.5f, -1.0f};
  std::vector<float> edited = raw;
  edited[2] = -kInf;  // a masked token
  SampleRow row;
  row.greedy = true;
  row.temperature = 0.5f;  // unused by a greedy row, as in sampling
  row.num_logprobs = 1;
  const TokenLogprob logits = logprob_in_mode(raw, edited, row, 1, LogprobsMode::ProcessedLogits);
  EXPECT_FLOAT_EQ(logits.logprob, 2.0f);
  const TokenLogprob logprobs = logprob_in_mode(raw, edited, row, 1, LogprobsMode::ProcessedLogprobs);
  const double total = std::exp(1.0) + std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(logprobs.logprob, 2.0 - std::log(total), 1e-6);
}

TEST(LogprobsMode, TheModeChangesTheReportNotTheToken) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> raw(40);
  for (float& v : raw) v = normal(rng);
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.9f;
  params.seed = 7;
  params.logprobs = 2;
  params.logit_bias = {{4, 3.0f}};
  for (const LogprobsMode mode : {LogprobsMode::ProcessedLogprobs, LogprobsMode::RawLogits, LogprobsMode::ProcessedLogits}) {
    SamplerState raw_state(7, {}, params), mode_state(7, {}, params);
    for (int i = 0; i < 10; ++i) {
      const SampledToken a = sample_token(raw, params, raw_state, {}, LogprobsMode::RawLogprobs);
      const SampledToken b = sample_token(raw, params, mode_state, {}, mode);
      EXPECT_EQ(a.token, b.token);
      ASSERT_TRUE(b.logprob.has_value());
      EXPECT_NE(a.logprob->logprob, b.logprob->logprob);
    }
  }
}

TEST(LogprobsMode, NamesParseAndABadOneIsRefusedNamingTheFlag) {
  for (const LogprobsMode mode : {LogprobsMode::RawLogprobs, LogprobsMode::ProcessedLogprobs, LogprobsMode::RawLogits,
                                  LogprobsMode::ProcessedLogits}) {
    EXPECT_EQ(parse_logprobs_mode(to_string(mode)), mode);
  }
  try {
    parse_logprobs_mode("logits");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--logprobs-mode"), std::string::npos);
  }
}

}  // namespace
}  // namespace beamline
