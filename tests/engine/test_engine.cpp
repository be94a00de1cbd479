// The engine with a fake model that checks paging: concurrent requests all finish, batched results equal
// one-at-a-time results (greedy and seeded), preemption and prefix caching do not change outputs, abort
// and shutdown free everything, bad requests are refused naming the field.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine_stats_wait.h"
#include "fake_model_runner.h"
#include "fake_tokenizer.h"

namespace beamline {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kWindow = 12;

std::unique_ptr<testing::FakeModelRunner> make_runner(int32_t num_blocks) {
  return std::make_unique<testing::FakeModelRunner>(testing::fake_layout(kBlockSize, num_blocks, 1, 2), kWindow, kVocab, 512);
}

EngineConfig small_config(bool prefix_caching = true) {
  EngineConfig config;
  config.max_num_seqs = 6;
  config.max_num_batched_tokens = 24;
  config.max_model_len = 160;
  config.enable_prefix_caching = prefix_caching;
  return config;
}

std::unique_ptr<Engine> make_engine(EngineConfig config, int32_t num_blocks,
                                    std::chrono::microseconds step_delay = std::chrono::microseconds(0)) {
  auto runner = make_runner(num_blocks);
  runner->step_delay = step_delay;
  return std::make_unique<Engine>(config, std::move(runner), nullptr, std::vector<TokenId>{0});
}

GenerationRequest random_request(std::mt19937& rng, const std::string& id, int32_t prompt_length) {
  GenerationRequest request;
  request.request_id = id;
  request.detokenize = false;
  for (int32_t i = 0; i < prompt_length; ++i) request.prompt.push_back(1 + static_cast<TokenId>(rng() % (kVocab - 1)));
  request.sampling.max_tokens = 4 + static_cast<int32_t>(rng() % 40);
  if (rng() % 2) {
    request.sampling.temperature = 0.0f;
  } else {
    request.sampling.temperature = 0.9f;
    request.sampling.top_p = 0.95f;
    request.sampling.seed = rng();
  }
  return request;
}

using Results = std::map<std::string, RequestOutput>;

// All requests at once from several client threads.
Results run_concurrently(Engine& engine, const std::vector<GenerationRequest>& requests, int threads = 4) {
  Results results;
  std::mutex mutex;
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      for (std::size_t i = t; i < requests.size(); i += threads) {
        auto stream = engine.add_request(requests[i]);
        RequestOutput output = collect_output(*stream);
        std::lock_guard lock(mutex);
        results[requests[i].request_id] = std::move(output);
      }
    });
  }
  for (auto& client : clients) client.join();
  return results;
}

// The reference: each request alone, with the synchronous loop (--no-async-scheduling).
Results run_one_at_a_time(const std::vector<GenerationRequest>& requests, int32_t num_blocks, bool prefix_caching = false) {
  Results results;
  for (const GenerationRequest& request : requests) {
    EngineConfig config = small_config(prefix_caching);
    config.async_scheduling = false;
    auto engine = make_engine(config, num_blocks);
    results[request.request_id] = collect_output(*engine->add_request(request));
  }
  return results;
}

void expect_same_tokens(const Results& a, const Results& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, output] : a) {
    const RequestOutput& other = b.at(id);
    ASSERT_EQ(output.samples.size(), other.samples.size()) << id;
    for (std::size_t s = 0; s < output.samples.size(); ++s) {
      EXPECT_EQ(output.samples[s].token_ids, other.samples[s].token_ids) << id << " sample " << s;
      EXPECT_EQ(output.samples[s].finish_reason, other.samples[s].finish_reason) << id;
    }
  }
}

TEST(Engine, ConcurrentRequestsAllFinishWithTheirSingleRequestResults) {
  std::mt19937 rng(1);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 24; ++i) requests.push_back(random_request(rng, fmt::format("r{}", i), 1 + rng() % 50));
  auto engine = make_engine(small_config(), 400);
  const Results batched = run_concurrently(*engine, requests);
  for (const auto& [id, output] : batched) {
    EXPECT_TRUE(output.finished);
    EXPECT_FALSE(output.error) << *output.error;
    ASSERT_EQ(output.samples.size(), 1u);
    EXPECT_GE(output.samples[0].token_ids.size(), 1u);
    EXPECT_EQ(output.usage.completion_tokens, static_cast<int32_t>(output.samples[0].token_ids.size()));
  }
  expect_same_tokens(batched, run_one_at_a_time(requests, 400));
  engine->shutdown(ShutdownMode::Drain);  // the last snapshot is final
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.requests_finished_total, 24u);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
  EXPECT_EQ(stats.time_to_first_token.count, 24u);
}

TEST(Engine, PreemptionAndResumeGiveTheSameOutputs) {
  std::mt19937 rng(2);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 12; ++i) {
    auto request = random_request(rng, fmt::format("p{}", i), 10 + rng() % 30);
    request.sampling.max_tokens = 60 + static_cast<int32_t>(rng() % 40);
    request.sampling.ignore_eos = true;
    requests.push_back(request);
  }
  // 70 blocks: one sequence of max_model_len fits (40 full + sliding), six of these do not.
  auto engine = make_engine(small_config(), 70);
  const Results batched = run_concurrently(*engine, requests);
  engine->shutdown(ShutdownMode::Drain);
  EXPECT_GT(engine->stats().preemptions_total, 0u) << "the pool must be small enough to preempt";
  int32_t preempted_requests = 0;
  for (const auto& [id, output] : batched) preempted_requests += output.metrics.preemptions > 0;
  EXPECT_GT(preempted_requests, 0);
  expect_same_tokens(batched, run_one_at_a_time(requests, 400));
}

TEST(Engine, PrefixCachingServesMultiTurnPromptsWithoutChangingOutputs) {
  std::mt19937 rng(3);
  for (const bool caching : {true, false}) {
    auto engine = make_engine(small_config(caching), 400);
    GenerationRequest first = random_request(rng, "turn1", 30);
    first.sampling.temperature = 0.0f;
    first.sampling.max_tokens = 10;
    first.sampling.ignore_eos = true;
    const RequestOutput one = collect_output(*engine->add_request(first));
    GenerationRequest second = first;
    second.request_id = "turn2";
    second.prompt.insert(second.prompt.end(), one.samples[0].token_ids.begin(), one.samples[0].token_ids.end());
    for (int i = 0; i < 7; ++i) second.prompt.push_back(1 + static_cast<TokenId>(rng() % 60));
    const RequestOutput two = collect_output(*engine->add_request(second));
    const Results alone = run_one_at_a_time({second}, 400);
    EXPECT_EQ(two.samples[0].token_ids, alone.at("turn2").samples[0].token_ids);
    engine->shutdown(ShutdownMode::Drain);
    const EngineStats stats = engine->stats();
    if (caching) {
      // The first turn's 40 tokens are in the cache (its last token's block only once computed: 36 or 40).
      EXPECT_GE(two.usage.cached_tokens, 36);
      EXPECT_EQ(stats.prefix_cache_queries_total, 30u + 47u);
      EXPECT_EQ(stats.prefix_cache_hits_total, static_cast<uint64_t>(two.usage.cached_tokens));
    } else {
      EXPECT_EQ(two.usage.cached_tokens, 0);
      EXPECT_EQ(stats.prefix_cache_hits_total, 0u);
    }
  }
}

TEST(Engine, ParallelSamplesShareThePromptAndMatchSingleSeededRequests) {
  std::mt19937 rng(4);
  auto engine = make_engine(small_config(), 400);
  GenerationRequest request = random_request(rng, "n3", 33);
  request.sampling.n = 3;
  request.sampling.temperature = 1.0f;
  request.sampling.seed = 100;
  request.sampling.max_tokens = 15;
  const RequestOutput output = collect_output(*engine->add_request(request));
  ASSERT_EQ(output.samples.size(), 3u);
  EXPECT_NE(output.samples[0].token_ids, output.samples[1].token_ids);
  int32_t completion = 0;
  for (const auto& s : output.samples) completion += static_cast<int32_t>(s.token_ids.size());
  EXPECT_EQ(output.usage.completion_tokens, completion);
  EXPECT_EQ(output.usage.cached_tokens, 0);
  for (int32_t i = 0; i < 3; ++i) {
    GenerationRequest single = request;
    single.request_id = fmt::format("single{}", i);
    single.sampling.n = 1;
    single.sampling.seed = 100 + i;
    const RequestOutput alone = collect_output(*engine->add_request(single));
    EXPECT_EQ(alone.samples[0].token_ids, output.samples[i].token_ids) << "sample " << i;
    EXPECT_EQ(alone.usage.cached_tokens, 32);
  }
  engine->shutdown(ShutdownMode::Drain);
  // Samples 1 and 2 reuse the prompt's 8 full blocks, and so does each later single request.
  EXPECT_EQ(engine->stats().prefix_cache_hits_total, 5u * 32u);
}

TEST(Engine, ChunkedPrefillAndBudgetsDoNotChangeOutputs) {
  std::mt19937 rng(5);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(random_request(rng, fmt::format("c{}", i), 40 + rng() % 60));
  EngineConfig tight = small_config();
  tight.max_num_seqs = 2;
  tight.max_num_batched_tokens = 5;
  auto runner = make_runner(400);
  auto* fake = runner.get();
  Engine engine(tight, std::move(runner), nullptr, {0});
  const Results chunked = run_concurrently(engine, requests);
  EXPECT_LE(fake->max_batch_tokens, 5);
  expect_same_tokens(chunked, run_one_at_a_time(requests, 400));
}

TEST(Engine, AbortEndsTheStreamAndFreesBlocks) {
  auto engine = make_engine(small_config(), 400, std::chrono::milliseconds(2));
  std::mt19937 rng(6);
  GenerationRequest request = random_request(rng, "long", 20);
  request.sampling.max_tokens = 130;
  request.sampling.ignore_eos = true;
  auto stream = engine->add_request(request);
  auto first = stream->next();
  ASSERT_TRUE(first);
  engine->abort("long");
  engine->abort("unknown-id");
  RequestOutput rest = collect_output(*stream);
  merge_output(*first, std::move(rest));
  EXPECT_TRUE(first->finished);
  EXPECT_EQ(first->samples[0].finish_reason, FinishReason::Abort);
  EXPECT_LT(first->samples[0].token_ids.size(), 130u);
  const EngineStats stats = wait_for_stats(*engine, [](const EngineStats& s) { return s.requests_finished_total == 1; });
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
  EXPECT_EQ(stats.requests_aborted, 1u);
  // The id can be used again once the request ended.
  request.sampling.max_tokens = 2;
  EXPECT_TRUE(collect_output(*engine->add_request(request)).finished);
}

TEST(Engine, ShutdownDrainsOrAborts) {
  std::mt19937 rng(7);
  for (const ShutdownMode mode : {ShutdownMode::Drain, ShutdownMode::Abort}) {
    auto engine = make_engine(small_config(), 400, std::chrono::milliseconds(1));
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 6; ++i) {
      auto request = random_request(rng, fmt::format("s{}", i), 10);
      request.sampling.max_tokens = 100;
      request.sampling.ignore_eos = true;
      streams.push_back(engine->add_request(request));
    }
    engine->shutdown(mode);
    EXPECT_THROW(engine->add_request(random_request(rng, "late", 3)), Error);
    for (auto& stream : streams) {
      const RequestOutput output = collect_output(*stream);
      EXPECT_TRUE(output.finished);
      if (mode == ShutdownMode::Drain) {
        EXPECT_EQ(output.samples[0].finish_reason, FinishReason::Length);
        EXPECT_EQ(output.samples[0].token_ids.size(), 100u);
      } else {
        EXPECT_EQ(output.samples.at(0).finish_reason, FinishReason::Abort);
      }
    }
  }
}

TEST(Engine, RefusesBadRequestsNamingTheField) {
  auto engine = make_engine(small_config(), 400, std::chrono::milliseconds(1));
  std::mt19937 rng(8);
  auto expect_param = [&](GenerationRequest request, const std::string& param) {
    try {
      engine->add_request(std::move(request));
      ADD_FAILURE() << "accepted a request with a bad " << param;
    } catch (const InvalidRequest& error) {
      EXPECT_EQ(error.param(), param) << error.what();
    }
  };
  GenerationRequest good = random_request(rng, "x", 5);
  auto bad = good;
  bad.prompt.clear();
  expect_param(bad, "prompt");
  bad = good;
  bad.prompt[2] = kVocab;
  expect_param(bad, "prompt");
  bad = good;
  bad.prompt.assign(160, 1);
  expect_param(bad, "prompt");
  bad = good;
  bad.sampling.max_tokens = 156;
  expect_param(bad, "max_tokens");
  bad.sampling.max_tokens = 0;
  expect_param(bad, "max_tokens");
  bad = good;
  bad.sampling.logprobs = 21;
  expect_param(bad, "logprobs");
  bad = good;
  bad.sampling.n = 0;
  expect_param(bad, "n");
  bad = good;
  bad.sampling.temperature = -1;
  expect_param(bad, "temperature");
  bad = good;
  bad.sampling.top_p = 0;
  expect_param(bad, "top_p");
  bad = good;
  bad.sampling.stop = {"x"};
  expect_param(bad, "stop");  // no tokenizer
  bad = good;
  bad.detokenize = true;
  expect_param(bad, "detokenize");
  bad = good;
  bad.sampling.logit_bias = {{-1, 1.0f}};
  expect_param(bad, "logit_bias");
  good.sampling.max_tokens = 150;
  good.sampling.ignore_eos = true;
  auto stream = engine->add_request(good);
  expect_param(good, "request_id");  // still in flight
  collect_output(*stream);
}

TEST(Engine, StartupChecksThePoolAgainstMaxModelLen) {
  EngineConfig config = small_config();
  EXPECT_THROW(make_engine(config, 40), Error);  // 160 tokens need 40 full + sliding blocks
  config.max_model_len = 1000;
  EXPECT_THROW(make_engine(config, 4000), Error);  // beyond the model's 512 positions
  config.max_model_len = 0;
  EXPECT_EQ(make_engine(config, 4000)->config().max_model_len, 512);
  // Unset, it shrinks to what the pool holds: 100 blocks = 2 x 10 sliding + 80 full = 320 tokens.
  EXPECT_EQ(make_engine(config, 100)->config().max_model_len, 320);
  config.block_size = 8;
  EXPECT_THROW(make_engine(config, 4000), Error);
}

TEST(Engine, TextStopStringsAndLogprobsThroughTheEngine) {
  // Token i decodes to the letter 'a' + i % 26, so the text is the token sequence.
  std::vector<std::string> pieces;
  for (int i = 0; i < kVocab; ++i) pieces.push_back(std::string(1, static_cast<char>('a' + i % 26)));
  auto tokenizer = std::make_shared<testing::FakeTokenizer>(pieces, std::vector<TokenId>{});
  Engine engine(small_config(), make_runner(400), tokenizer, {0});
  std::mt19937 rng(9);
  GenerationRequest request = random_request(rng, "t", 8);
  request.detokenize = true;
  request.sampling.temperature = 0.0f;
  request.sampling.ignore_eos = true;
  request.sampling.max_tokens = 40;
  request.sampling.logprobs = 3;
  const RequestOutput reference = collect_output(*engine.add_request(request));
  std::string text;
  for (TokenId t : reference.samples[0].token_ids) text += pieces[t];
  EXPECT_EQ(reference.samples[0].text, text);
  ASSERT_EQ(reference.samples[0].logprobs.size(), reference.samples[0].token_ids.size());
  for (const TokenLogprob& lp : reference.samples[0].logprobs) {
    EXPECT_EQ(lp.rank, 1) << "greedy picks the most likely token";
    EXPECT_EQ(lp.top.size(), 3u);
    EXPECT_LE(lp.logprob, 0.0f);
  }
  // Stop on the text of tokens 10..12 of the reference output.
  request.request_id = "t2";
  request.sampling.stop = {text.substr(10, 3)};
  const RequestOutput stopped = collect_output(*engine.add_request(request));
  const std::size_t at = text.find(request.sampling.stop[0]);
  EXPECT_EQ(stopped.samples[0].text, text.substr(0, at));
  EXPECT_EQ(stopped.samples[0].token_ids.size(), at + 3);
  EXPECT_EQ(std::get<std::string>(stopped.samples[0].stop_reason), request.sampling.stop[0]);
}

// --async-scheduling (the default, so the tests above run it too): every scenario gives the outputs of the
// synchronous loop, one request at a time, and its steps do read their tokens from the previous step's samples.
EngineConfig async_config(EngineConfig config) {
  config.async_scheduling = true;
  return config;
}

TEST(AsyncScheduling, ConcurrentRequestsPreemptionAndChunksGiveTheSynchronousOutputs) {
  std::mt19937 rng(11);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 18; ++i) {
    GenerationRequest request = random_request(rng, fmt::format("a{}", i), 1 + rng() % 40);
    if (i % 3 == 0) request.sampling.ignore_eos = true;
    if (i % 4 == 1) request.sampling.logprobs = 2;
    if (i % 5 == 2) request.sampling.presence_penalty = 0.5f;  // sampled on the host: that step waits
    requests.push_back(request);
  }
  const Results alone = run_one_at_a_time(requests, 400);
  struct Case {
    const char* name;
    int32_t max_num_seqs, max_num_batched_tokens, num_blocks;
  };
  for (const Case& c : {Case{"roomy", 6, 24, 400}, Case{"preempting", 6, 24, 70}, Case{"chunked", 2, 5, 400}}) {
    SCOPED_TRACE(c.name);
    EngineConfig config = async_config(small_config());
    config.max_num_seqs = c.max_num_seqs;
    config.max_num_batched_tokens = c.max_num_batched_tokens;
    auto runner = make_runner(c.num_blocks);
    auto* fake = runner.get();
    Engine engine(config, std::move(runner), nullptr, {0});
    const Results overlapped = run_concurrently(engine, requests);
    for (const auto& [id, output] : overlapped) {
      EXPECT_FALSE(output.error) << id << ": " << *output.error;
      EXPECT_EQ(output.usage.completion_tokens, static_cast<int32_t>(output.samples[0].token_ids.size())) << id;
      EXPECT_EQ(output.samples[0].logprobs.size(), alone.at(id).samples[0].logprobs.size()) << id;
    }
    expect_same_tokens(overlapped, alone);
    engine.shutdown(ShutdownMode::Drain);
    const EngineStats stats = engine.stats();
    EXPECT_GT(fake->deferred_steps, 0) << "steps must have read their tokens from the previous step's samples";
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
    EXPECT_EQ(stats.requests_finished_total, requests.size());
  }
}

TEST(AsyncScheduling, StopStringsParallelSamplesAndAbortMidFlight) {
  std::vector<std::string> pieces;
  for (int i = 0; i < kVocab; ++i) pieces.push_back(std::string(1, static_cast<char>('a' + i % 26)));
  auto tokenizer = std::make_shared<testing::FakeTokenizer>(pieces, std::vector<TokenId>{});
  std::mt19937 rng(12);
  GenerationRequest request = random_request(rng, "t", 8);
  request.detokenize = true;
  request.sampling.temperature = 0.0f;
  request.sampling.ignore_eos = true;
  request.sampling.max_tokens = 40;
  EngineConfig synchronous = small_config();
  synchronous.async_scheduling = false;
  Engine sync_engine(synchronous, make_runner(400), tokenizer, {0});
  const RequestOutput reference = collect_output(*sync_engine.add_request(request));
  const std::string text = reference.samples[0].text;
  request.request_id = "t-stop";
  request.sampling.stop = {text.substr(10, 3)};
  const RequestOutput stopped_sync = collect_output(*sync_engine.add_request(request));
  EXPECT_EQ(stopped_sync.samples[0].token_ids.size(), text.find(request.sampling.stop[0]) + 3);

  auto runner = make_runner(400);
  runner->step_delay = std::chrono::milliseconds(1);
  Engine engine(async_config(small_config()), std::move(runner), tokenizer, {0});
  const RequestOutput stopped = collect_output(*engine.add_request(request));
  EXPECT_EQ(stopped.samples[0].text, stopped_sync.samples[0].text);
  EXPECT_EQ(stopped.samples[0].token_ids, stopped_sync.samples[0].token_ids);

  GenerationRequest parallel = random_request(rng, "n2", 20);
  parallel.sampling.n = 2;
  parallel.sampling.temperature = 1.0f;
  parallel.sampling.seed = 7;
  parallel.sampling.max_tokens = 12;
  const RequestOutput parallel_async = collect_output(*engine.add_request(parallel));
  parallel.request_id = "n2-sync";
  const RequestOutput parallel_sync = collect_output(*sync_engine.add_request(parallel));
  for (int s = 0; s < 2; ++s)
    EXPECT_EQ(parallel_async.samples[s].token_ids, parallel_sync.samples[s].token_ids) << "sample " << s;

  GenerationRequest long_request = random_request(rng, "long", 20);
  long_request.sampling.max_tokens = 130;
  long_request.sampling.ignore_eos = true;
  auto stream = engine.add_request(long_request);
  auto first = stream->next();
  ASSERT_TRUE(first);
  engine.abort("long");
  RequestOutput rest = collect_output(*stream);
  merge_output(*first, std::move(rest));
  EXPECT_EQ(first->samples[0].finish_reason, FinishReason::Abort);
  const EngineStats stats = wait_for_stats(engine, [](const EngineStats& s) { return s.requests_finished_total == 3; });
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

TEST(EngineCore, HybridSavingsAreReportedPerRequestAndInTotal) {
  auto runner = make_runner(400);
  const EngineConfig config = resolve_engine_config(small_config(), *runner);
  EngineCore core(config, *runner, nullptr, {0});
  std::mt19937 rng(10);
  GenerationRequest request = random_request(rng, "h", 60);
  request.sampling.max_tokens = 40;
  request.sampling.ignore_eos = true;
  auto stream = std::make_shared<OutputStream>("h");
  core.add_request(request, stream);
  int64_t peak_saved = 0;
  while (core.has_work()) {
    core.step();
    peak_saved = std::max(peak_saved, core.stats().kv_hybrid_saved_bytes);
  }
  const RequestOutput output = collect_output(*stream);
  // The last step computes position 98: 25 blocks; every layer (6) would keep their 100 positions; the hybrid
  // layout holds 25 full blocks + 2 x 4 sliding ones (positions 87..98 = blocks 21..24), 2 slots x 4 tokens
  // each: (6 * 100 - 33 * 2 * 4) layer-token slots of 64 bytes.
  const int64_t expected = (6 * 100 - (25 + 2 * 4) * 2 * 4) * 64;
  EXPECT_EQ(output.metrics.kv_hybrid_saved_bytes, expected);
  EXPECT_GT(peak_saved, 0);
  EXPECT_EQ(core.stats().kv_hybrid_saved_bytes_finished_total, static_cast<uint64_t>(expected));
}

}  // namespace
}  // namespace beamline
