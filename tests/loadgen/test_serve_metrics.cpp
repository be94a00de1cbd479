// beamline bench serve's arithmetic against hand-computed values: SSE framing across arbitrary splits, numpy's
// percentiles, vLLM's TPOT / throughput definitions, the summary's lines and the result JSON's keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "loadgen/datasets.h"
#include "loadgen/openai_stream_client.h"
#include "loadgen/prefix_cache_counters.h"
#include "loadgen/serve_metrics.h"
#include "loadgen/sse_reader.h"
#include "util/error.h"

namespace beamline::loadgen {
namespace {

TEST(SseReader, EventsComeOutWholeHoweverTheBytesAreSplit) {
  const std::string stream =
      ": keep-alive\n\ndata: {\"a\": 1}\n\nevent: response.created\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\ndata: [DONE]\n\n";
  std::mt19937 random(7);
  for (int trial = 0; trial < 50; ++trial) {
    SseReader reader;
    std::vector<SseEvent> events;
    for (std::size_t at = 0; at < stream.size();) {
      const std::size_t size = std::uniform_int_distribution<std::size_t>(1, 7)(random);
      for (SseEvent& event : reader.push(std::string_view(stream).substr(at, size))) events.push_back(std::move(event));
      at += size;
    }
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[0].event, "");
    EXPECT_EQ(events[0].data, "{\"a\": 1}");
    EXPECT_EQ(events[1].event, "response.created");
    EXPECT_EQ(events[1].data, "{\"b\":\n2}");
    EXPECT_EQ(events[2].data, "[DONE]");
  }
}

TEST(ServeMetrics, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> values = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(values, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(values, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile(values, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);
  EXPECT_EQ(percentile_label(99), "99");
  EXPECT_EQ(percentile_label(99.9), "99.9");
}

TEST(ServeMetrics, VllmDefinitions) {
  RequestResult a;
  a.success = true;
  a.ttft = 0.1;
  a.latency = 1.1;
  a.itl = {0.2, 0.3, 0.5};
  a.prompt_len = 10;
  a.output_tokens = 11;  // TPOT (1.1 - 0.1) / 10 = 0.1 s
  RequestResult b = a;
  b.ttft = 0.3;
  b.latency = 0.3;
  b.itl = {};
  b.output_tokens = 1;  // no TPOT for a single token
  RequestResult failed;
  failed.error = "HTTP 400";
  const ServeMetrics metrics = compute_metrics({a, b, failed}, 2.0, 2, {50, 99});
  EXPECT_EQ(metrics.completed, 2);
  EXPECT_EQ(metrics.failed, 1);
  EXPECT_EQ(metrics.total_input, 20);
  EXPECT_EQ(metrics.total_output, 12);
  EXPECT_DOUBLE_EQ(metrics.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(metrics.output_throughput, 6.0);
  EXPECT_DOUBLE_EQ(metrics.total_token_throughput, 16.0);
  EXPECT_NEAR(metrics.latency.at("ttft").mean, 200, 1e-9);
  EXPECT_NEAR(metrics.latency.at("ttft").std, 100, 1e-9);
  EXPECT_NEAR(metrics.latency.at("tpot").mean, 100, 1e-9);
  EXPECT_NEAR(metrics.latency.at("itl").median, 300, 1e-9);
  EXPECT_NEAR(metrics.latency.at("e2el").percentiles.at(1).second, 300 + 0.99 * 800, 1e-9);

  const std::string summary = format_summary(metrics, {"ttft", "e2el"}, "4", "inf");
  EXPECT_NE(summary.find("============ Serving Benchmark Result ============\n"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Successful requests:                     2"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Output token throughput (tok/s):         6.00"), std::string::npos) << summary;
  EXPECT_NE(summary.find("---------------Time to First Token----------------\n"), std::string::npos) << summary;
  EXPECT_NE(summary.find("P99 E2EL (ms):"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("TPOT"), std::string::npos) << "tpot was not selected";

  const nlohmann::json json = metrics_json(metrics, {"ttft", "tpot"}, {a, b, failed}, true);
  for (const char* key : {"completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                          "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                          "p50_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "ttfts", "itls", "errors", "generated_texts"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_FALSE(json.contains("mean_itl_ms"));
  EXPECT_EQ(json["errors"][2], "HTTP 400");
}

TEST(ServeMetrics, OptionListsAreChecked) {
  EXPECT_EQ(parse_metric_names("ttft, e2el"), (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_THROW(parse_metric_names("ttft,latency"), Error);
  EXPECT_EQ(parse_percentiles("50,99.9"), (std::vector<double>{50, 99.9}));
  EXPECT_THROW(parse_percentiles("0"), Error);
  EXPECT_THROW(parse_percentiles("abc"), Error);
}

TEST(Datasets, RandomLengthsStayInTheirRangeAndShareThePrefix) {
  RandomDatasetOptions options;
  options.num_prompts = 50;
  options.input_len = 20;
  options.output_len = 8;
  options.range_ratio = 0.5;
  options.prefix_len = 4;
  options.token_id_low = 10;
  options.token_id_high = 99;
  const std::vector<BenchRequest> requests = random_dataset(options, ApiKind::Completions);
  ASSERT_EQ(requests.size(), 50u);
  for (const BenchRequest& request : requests) {
    EXPECT_GE(request.prompt_len, 4 + 10);
    EXPECT_LE(request.prompt_len, 4 + 30);
    EXPECT_EQ(request.prompt.size(), static_cast<std::size_t>(request.prompt_len));
    EXPECT_GE(request.output_len, 4);
    EXPECT_LE(request.output_len, 12);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(request.prompt[i], requests[0].prompt[i]);
    for (const auto& id : request.prompt) EXPECT_TRUE(id >= 10 && id <= 99);
  }
  EXPECT_EQ(random_dataset(options, ApiKind::Completions)[7].prompt, requests[7].prompt) << "same seed, same prompts";
  EXPECT_TRUE(random_dataset(options, ApiKind::ChatCompletions)[0].prompt.is_string());
}

TEST(PrefixCacheCounters, ReadFromPrometheusTextAndDifferenced) {
  const auto before = parse_prefix_cache_counters(
      "# HELP vllm:prefix_cache_queries_total Tokens looked up.\n"
      "vllm:prefix_cache_queries_total{model_name=\"m\"} 100\n"
      "vllm:prefix_cache_queries_total_created 5\n"
      "vllm:prefix_cache_hits_total{model_name=\"m\"} 40\n");
  ASSERT_TRUE(before);
  EXPECT_DOUBLE_EQ(before->queries, 100);
  EXPECT_DOUBLE_EQ(before->hits, 40);
  const auto after = parse_prefix_cache_counters("vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 190\n");
  EXPECT_DOUBLE_EQ(*hit_rate_between(before, after), 0.75);
  EXPECT_FALSE(hit_rate_between(before, before)) << "nothing queried: no rate";
  EXPECT_FALSE(parse_prefix_cache_counters("other_metric 1\n"));
}

TEST(Datasets, MultiTurnSessions) {
  const std::vector<BenchSession> sessions = multi_turn_dataset(MultiTurnDatasetOptions{3, 4, 10, 5, 0.0, 1});
  ASSERT_EQ(sessions.size(), 3u);
  for (const BenchSession& session : sessions) {
    ASSERT_EQ(session.user_turns.size(), 4u);
    EXPECT_EQ(session.output_len, 5);
    for (const std::string& turn : session.user_turns) EXPECT_EQ(std::count(turn.begin(), turn.end(), ' '), 9) << turn;
  }
  EXPECT_NE(sessions[0].user_turns[0], sessions[1].user_turns[0]);
}

TEST(OpenAIStreamClient, PayloadsAndUrls) {
  BenchRequest request;
  request.prompt = nlohmann::json::array({1, 2, 3});
  request.output_len = 5;
  const nlohmann::json completion = request_payload(ApiKind::Completions, "m", request, true, {{"top_p", 0.9}});
  EXPECT_EQ(completion, nlohmann::json::parse(R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0.0,
      "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true, "top_p": 0.9})"));
  request.prompt = "hello";
  const nlohmann::json chat = request_payload(ApiKind::ChatCompletions, "m", request, false, nlohmann::json::object());
  EXPECT_EQ(chat["messages"], nlohmann::json::parse(R"([{"role": "user", "content": "hello"}])"));
  EXPECT_EQ(chat["max_completion_tokens"], 5);
  EXPECT_FALSE(chat.contains("ignore_eos"));
  EXPECT_EQ(split_url("http://h:1/proxy/").base_url, "http://h:1");
  EXPECT_EQ(split_url("http://h:1/proxy/").path, "/proxy");
  EXPECT_EQ(split_url("http://h:1").path, "");
  EXPECT_THROW(split_url("h:1"), Error);
}

}  // namespace
}  // namespace beamline::loadgen
