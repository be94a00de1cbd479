// Bearer-token checks and the Prometheus text of /metrics (against a naive reference on random data).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>
#include <sstream>

#include "server/auth.h"
#include "server/metrics.h"

namespace beamline::server {
namespace {

TEST(Auth, BearerTokenMustMatchExactly) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string key;
    const std::size_t length = 1 + rng() % 40;
    for (std::size_t i = 0; i < length; ++i) key += static_cast<char>('!' + rng() % 90);
    EXPECT_TRUE(bearer_token_matches("Bearer " + key, key));
    EXPECT_FALSE(bearer_token_matches(key, key));
    EXPECT_FALSE(bearer_token_matches("bearer " + key, key));
    EXPECT_FALSE(bearer_token_matches("Bearer " + key + "x", key));
    EXPECT_FALSE(bearer_token_matches("Bearer " + key.substr(0, length - 1), key));
    std::string changed = key;
    changed[rng() % length] ^= 0x01;
    EXPECT_FALSE(bearer_token_matches("Bearer " + changed, key));
    EXPECT_FALSE(bearer_token_matches("", key));
  }
}

TEST(Auth, OnlyTheApiNeedsTheKey) {
  EXPECT_TRUE(path_needs_api_key("/v1/chat/completions"));
  EXPECT_TRUE(path_needs_api_key("/v1/models"));
  EXPECT_TRUE(path_needs_api_key("/v1"));
  EXPECT_FALSE(path_needs_api_key("/health"));
  EXPECT_FALSE(path_needs_api_key("/metrics"));
  EXPECT_FALSE(path_needs_api_key("/v10"));
}

// name{labels} -> value, for every sample line.
std::map<std::string, double> parse_samples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t space = line.rfind(' ');
    samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return samples;
}

TEST(Metrics, HistogramBucketsAreCumulativeCountsOfObservations) {
  std::mt19937 rng(11);
  std::exponential_distribution<double> latency(20.0);
  EngineStats stats;
  std::vector<double> observed;
  for (int i = 0; i < 500; ++i) {
    observed.push_back(latency(rng));
    stats.time_to_first_token.observe(observed.back());
  }
  stats.num_running = 3;
  stats.prompt_tokens_total = 1234;
  stats.prefix_cache_hits_total = 77;
  const std::string text = render_metrics({stats}, {{200, 5}, {400, 2}}, 4, "beam");
  const auto samples = parse_samples(text);
  const std::string name = "vllm:time_to_first_token_seconds";
  for (double bound : stats.time_to_first_token.bounds) {
    const auto expected = std::count_if(observed.begin(), observed.end(), [&](double v) { return v <= bound; });
    const std::string key = name + "_bucket{model_name=\"beam\",engine=\"0\",le=\"" + fmt::format("{}", bound) + "\"}";
    ASSERT_TRUE(samples.count(key)) << key;
    EXPECT_EQ(samples.at(key), static_cast<double>(expected)) << key;
  }
  EXPECT_EQ(samples.at(name + "_bucket{model_name=\"beam\",engine=\"0\",le=\"+Inf\"}"), 500);
  EXPECT_EQ(samples.at(name + "_count{model_name=\"beam\",engine=\"0\"}"), 500);
  double sum = 0;
  for (double v : observed) sum += v;
  EXPECT_NEAR(samples.at(name + "_sum{model_name=\"beam\",engine=\"0\"}"), sum, 1e-9 * sum + 1e-12);
  EXPECT_EQ(samples.at("vllm:num_requests_running{model_name=\"beam\",engine=\"0\"}"), 3);
  EXPECT_EQ(samples.at("vllm:prompt_tokens_total{model_name=\"beam\",engine=\"0\"}"), 1234);
  EXPECT_EQ(samples.at("vllm:prefix_cache_hits_total{model_name=\"beam\",engine=\"0\"}"), 77);
  EXPECT_EQ(samples.at("beamline:http_responses_total{model_name=\"beam\",code=\"400\"}"), 2);
  EXPECT_EQ(samples.at("beamline:http_streams_active{model_name=\"beam\"}"), 4);
  for (const char* metric : {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total",
                             "vllm:prefix_cache_queries_total", "vllm:time_per_output_token_seconds",
                             "vllm:e2e_request_latency_seconds", "beamline:kv_cache_hybrid_saved_bytes"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + metric + " "), std::string::npos) << metric;
  }
}

TEST(Metrics, SpeculativeDecodingCountersShowOnlyWhenItIsOn) {
  EngineStats stats;
  EXPECT_EQ(render_metrics({stats}, {}, 0, "beam").find("spec_decode"), std::string::npos);
  stats.spec_decode_num_drafts_total = 10;
  stats.spec_decode_num_draft_tokens_total = 40;
  stats.spec_decode_num_accepted_tokens_total = 25;
  stats.spec_decode_num_accepted_tokens_per_pos = {9, 8, 5, 3};
  const auto samples = parse_samples(render_metrics({stats}, {}, 0, "beam"));
  EXPECT_EQ(samples.at("vllm:spec_decode_num_drafts_total{model_name=\"beam\",engine=\"0\"}"), 10);
  EXPECT_EQ(samples.at("vllm:spec_decode_num_draft_tokens_total{model_name=\"beam\",engine=\"0\"}"), 40);
  EXPECT_EQ(samples.at("vllm:spec_decode_num_accepted_tokens_total{model_name=\"beam\",engine=\"0\"}"), 25);
  EXPECT_EQ(samples.at("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"beam\",engine=\"0\",position=\"2\"}"), 5);
}

TEST(Metrics, EachDataParallelEngineHasItsOwnSamples) {
  EngineStats first, second;
  first.num_running = 2;
  second.num_running = 5;
  second.time_to_first_token.observe(0.01);
  const std::string text = render_metrics({first, second}, {}, 0, "beam");
  const auto samples = parse_samples(text);
  EXPECT_EQ(samples.at("vllm:num_requests_running{model_name=\"beam\",engine=\"0\"}"), 2);
  EXPECT_EQ(samples.at("vllm:num_requests_running{model_name=\"beam\",engine=\"1\"}"), 5);
  EXPECT_EQ(samples.at("vllm:time_to_first_token_seconds_count{model_name=\"beam\",engine=\"0\"}"), 0);
  EXPECT_EQ(samples.at("vllm:time_to_first_token_seconds_count{model_name=\"beam\",engine=\"1\"}"), 1);
  EXPECT_EQ(samples.at("beamline:http_streams_active{model_name=\"beam\"}"), 0);
  // One HELP/TYPE header per metric, whatever the number of engines.
  std::size_t headers = 0;
  for (std::size_t at = text.find("# TYPE vllm:num_requests_running "); at != std::string::npos;
       at = text.find("# TYPE vllm:num_requests_running ", at + 1))
    ++headers;
  EXPECT_EQ(headers, 1u);
}

TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  const std::string text = render_metrics({EngineStats{}}, {}, 0, "we\"ird");
  EXPECT_NE(text.find("model_name=\"we\\\"ird\""), std::string::npos);
}

}  // namespace
}  // namespace beamline::server
