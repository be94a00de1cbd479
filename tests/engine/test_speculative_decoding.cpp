// Speculative decoding (n-gram drafts) through the engine over the fake model, which checks every block it is given:
// greedy outputs equal those without speculation token for token (batched, under preemption, with prefix hits, stop
// tokens, stop strings, max_tokens, n > 1 and logprobs) while drafts do get accepted; and sampled outputs are
// distributed as without speculation: a chi-square test over 20,000 samples of the first three tokens at temperature
// 1 with top-p, which a deliberately biased acceptance rule fails.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <random>

#include "engine/engine.h"
#include "fake_model_runner.h"
#include "fake_tokenizer.h"

namespace beamline {
namespace {

constexpr int32_t kVocab = 8;  // small, so that drafts copied from the context are often right
constexpr int32_t kBlockSize = 4;
constexpr int32_t kWindow = 12;

// Fixed K unless `adaptive`: the tests that count drafts must not depend on this machine's step times.
SpeculativeConfig ngram(int32_t k, bool adaptive = false) {
  return parse_speculative_config(fmt::format(R"({{"method": "ngram", "num_speculative_tokens": {}, )"
                                              R"("prompt_lookup_min": 1, "prompt_lookup_max": 3, )"
                                              R"("adaptive_verification": {}}})",
                                              k, adaptive));
}

// Adaptive verification with stated step costs (seconds): `plain` for a step without drafts, plus `per_draft_row`
// for each verified draft token and `drafter` for a step with a drafter pass, each per decoding sequence.
SpeculativeConfig adaptive_ngram(int32_t k, double plain, double drafter, double per_draft_row) {
  SpeculativeConfig config = ngram(k, true);
  config.step_seconds_for_testing = [=](int32_t decoding, int32_t draft_tokens, bool drafter_ran) {
    return plain * decoding + (drafter_ran ? drafter * decoding : 0.0) + per_draft_row * draft_tokens;
  };
  return config;
}

EngineConfig engine_config(const SpeculativeConfig& speculative, bool prefix_caching) {
  EngineConfig config;
  config.max_num_seqs = 6;
  config.max_num_batched_tokens = 24;
  config.max_model_len = 160;
  config.enable_prefix_caching = prefix_caching;
  config.speculative = speculative;
  return config;
}

std::unique_ptr<Engine> make_engine(const EngineConfig& config, int32_t num_blocks,
                                    std::shared_ptr<const Tokenizer> tokenizer = nullptr, int32_t vocab = kVocab,
                                    float logit_scale = 1.0f) {
  auto runner = std::make_unique<testing::FakeModelRunner>(testing::fake_layout(kBlockSize, num_blocks, 1, 2), kWindow,
                                                           vocab, 512);
  runner->logit_scale = logit_scale;
  return std::make_unique<Engine>(config, std::move(runner), std::move(tokenizer), std::vector<TokenId>{0});
}

// Prompts that repeat a short random phrase, so the n-gram proposer finds drafts; greedy, with the features that
// cut or shape an output mixed in.
std::vector<GenerationRequest> repetitive_requests(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < count; ++i) {
    GenerationRequest request;
    request.request_id = fmt::format("s{}-{}", seed, i);
    request.detokenize = false;
    std::vector<TokenId> phrase(2 + rng() % 4);
    for (TokenId& token : phrase) token = 1 + static_cast<TokenId>(rng() % (kVocab - 1));
    for (int r = 0, repeats = 2 + static_cast<int>(rng() % 5); r < repeats; ++r)
      request.prompt.insert(request.prompt.end(), phrase.begin(), phrase.end());
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = 5 + static_cast<int32_t>(rng() % 40);
    request.sampling.ignore_eos = i % 3 != 0;
    if (i % 4 == 1) request.sampling.stop_token_ids = {3};
    if (i % 5 == 2) request.sampling.logprobs = 2;
    if (i % 7 == 3) request.sampling.n = 2;
    requests.push_back(std::move(request));
  }
  return requests;
}

using Results = std::map<std::string, RequestOutput>;

Results run_batched(Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (const GenerationRequest& request : requests) streams.push_back(engine.add_request(request));
  Results results;
  for (std::size_t i = 0; i < requests.size(); ++i) results[requests[i].request_id] = collect_output(*streams[i]);
  return results;
}

// The reference: no speculation, each request alone, the synchronous loop.
Results run_without_speculation(const std::vector<GenerationRequest>& requests) {
  Results results;
  for (const GenerationRequest& request : requests) {
    EngineConfig config = engine_config({}, false);
    config.async_scheduling = false;
    results[request.request_id] = collect_output(*make_engine(config, 4000)->add_request(request));
  }
  return results;
}

void expect_same_outputs(const Results& speculative, const Results& reference) {
  ASSERT_EQ(speculative.size(), reference.size());
  for (const auto& [id, output] : speculative) {
    const RequestOutput& expected = reference.at(id);
    ASSERT_FALSE(output.error) << *output.error;
    ASSERT_EQ(output.samples.size(), expected.samples.size()) << id;
    for (std::size_t s = 0; s < output.samples.size(); ++s) {
      EXPECT_EQ(output.samples[s].token_ids, expected.samples[s].token_ids) << id << " sample " << s;
      EXPECT_EQ(output.samples[s].finish_reason, expected.samples[s].finish_reason) << id;
      ASSERT_EQ(output.samples[s].logprobs.size(), expected.samples[s].logprobs.size()) << id;
      for (std::size_t t = 0; t < output.samples[s].logprobs.size(); ++t) {
        EXPECT_EQ(output.samples[s].logprobs[t].logprob, expected.samples[s].logprobs[t].logprob) << id << " " << t;
        EXPECT_EQ(output.samples[s].logprobs[t].top, expected.samples[s].logprobs[t].top) << id << " " << t;
      }
    }
    EXPECT_EQ(output.usage.completion_tokens, expected.usage.completion_tokens) << id;
  }
}

TEST(SpeculativeDecoding, GreedyOutputsEqualThoseWithoutSpeculation) {
  const auto requests = repetitive_requests(1, 30);
  auto engine = make_engine(engine_config(ngram(4), true), 4000);
  const Results results = run_batched(*engine, requests);
  engine->shutdown(ShutdownMode::Drain);
  expect_same_outputs(results, run_without_speculation(requests));
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.spec_decode_num_drafts_total, 0u);
  EXPECT_GT(stats.spec_decode_num_accepted_tokens_total, 0u) << "no draft was accepted: the test would not bite";
  EXPECT_LE(stats.spec_decode_num_accepted_tokens_total, stats.spec_decode_num_draft_tokens_total);
  ASSERT_EQ(stats.spec_decode_num_accepted_tokens_per_pos.size(), 4u);
  uint64_t per_position_sum = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    per_position_sum += stats.spec_decode_num_accepted_tokens_per_pos[i];
    if (i > 0) {
      EXPECT_LE(stats.spec_decode_num_accepted_tokens_per_pos[i], stats.spec_decode_num_accepted_tokens_per_pos[i - 1]);
    }
  }
  EXPECT_EQ(per_position_sum, stats.spec_decode_num_accepted_tokens_total);
  // Fewer target steps than tokens: drafts saved steps.
  EXPECT_LT(stats.steps_total, stats.generation_tokens_total);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

TEST(SpeculativeDecoding, PreemptionAndPrefixHitsKeepGreedyOutputs) {
  auto first_turns = repetitive_requests(2, 12);
  for (GenerationRequest& request : first_turns) request.sampling.n = 1;
  auto second_turns = repetitive_requests(3, 12);
  // 60 blocks of 4 tokens (1 full + 2 sliding groups): one 160-token sequence fits, six running ones do not.
  auto engine = make_engine(engine_config(ngram(5), true), 60);
  const Results first = run_batched(*engine, first_turns);
  // Each second turn is the first turn's prompt and answer, then more, as in a chat: its prefix hits cover blocks
  // that were filled while drafts were verified, so a block published with a rejected token (or a hash chained
  // through one) would serve wrong K/V here.
  for (std::size_t i = 0; i < second_turns.size(); ++i) {
    second_turns[i].request_id += "-turn2";
    std::vector<TokenId> prompt = first_turns[i].prompt;
    const std::vector<TokenId>& answer = first.at(first_turns[i].request_id).samples.at(0).token_ids;
    prompt.insert(prompt.end(), answer.begin(), answer.end());
    prompt.insert(prompt.end(), second_turns[i].prompt.begin(), second_turns[i].prompt.end());
    second_turns[i].prompt.assign(prompt.begin(), prompt.begin() + std::min<std::size_t>(prompt.size(), 100));
  }
  const Results second = run_batched(*engine, second_turns);
  engine->shutdown(ShutdownMode::Drain);
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.preemptions_total, 0u);
  EXPECT_GT(stats.prefix_cache_hits_total, 0u);
  EXPECT_GT(stats.spec_decode_num_accepted_tokens_total, 0u);
  expect_same_outputs(first, run_without_speculation(first_turns));
  expect_same_outputs(second, run_without_speculation(second_turns));
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

// Adaptive verification changes how many drafts each step verifies, never the outputs: greedy outputs equal those
// without speculation (batched, preemption, prefix hits) whether the stated costs make drafts pay or not; where they
// pay the steps draft, where a drafted step costs more than it wins most steps do not.
TEST(SpeculativeDecoding, AdaptiveVerificationKeepsGreedyOutputsAndFollowsTheCosts) {
  const auto requests = repetitive_requests(4, 30);
  const Results reference = run_without_speculation(requests);
  struct Case {
    const char* name;
    SpeculativeConfig config;
    bool drafts_pay;
  };
  const Case cases[] = {{"cheap drafts", adaptive_ngram(4, 1.0, 0.01, 0.005), true},
                        {"costly drafts", adaptive_ngram(4, 1.0, 3.0, 1.0), false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (const int32_t blocks : {4000, 60}) {  // 60: preemption
      auto engine = make_engine(engine_config(c.config, true), blocks);
      const Results results = run_batched(*engine, requests);
      engine->shutdown(ShutdownMode::Drain);
      expect_same_outputs(results, reference);
      const EngineStats stats = engine->stats();
      EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
      // Of the sequences' decode steps (each emits one token plus its accepted drafts), those that verified a draft.
      const double decode_steps = static_cast<double>(stats.generation_tokens_total -
                                                      stats.spec_decode_num_accepted_tokens_total);
      const double drafted_share = static_cast<double>(stats.spec_decode_num_drafts_total) / decode_steps;
      std::printf("%s, %d blocks: %llu steps, %.0f sequence decode steps, %.2f of them with a draft, %llu of %llu draft "
                  "tokens accepted\n",
                  c.name, blocks, static_cast<unsigned long long>(stats.steps_total), decode_steps, drafted_share,
                  static_cast<unsigned long long>(stats.spec_decode_num_accepted_tokens_total),
                  static_cast<unsigned long long>(stats.spec_decode_num_draft_tokens_total));
      if (c.drafts_pay) {
        EXPECT_GT(stats.spec_decode_num_accepted_tokens_total, 0u);
        EXPECT_GT(drafted_share, 0.5);
      } else {
        // Exploration only: the first drafted steps of each batch size, then one now and then.
        EXPECT_LT(drafted_share, 0.25);
      }
    }
  }
}

// On a runner that replays decode graphs (where a step with prompt rows runs op by op) new prompts wait a few steps
// while sequences decode and enter together (SchedulerConfig::max_prompt_hold_steps): 40% fewer verify steps carry
// prompt rows (48 -> 26 with fixed K, 44 -> 20 adaptive), and the greedy outputs stay those without speculation.
TEST(SpeculativeDecoding, OnAGraphRunnerNewPromptsWaitAndOutputsStay) {
  const auto requests = repetitive_requests(5, 80);
  const Results reference = run_without_speculation(requests);
  struct Counts {
    int64_t verify_steps = 0, with_prompt_rows = 0;
  };
  // 16 sequences at a time; with 4000 blocks of 4 tokens a step of 256 tokens (the prompts fit: no chunk makes a step
  // op by op anyway), with 60 (a few sequences at a time, preemption) the default 24.
  auto run = [&](bool adaptive, bool graphs, int32_t blocks) {
    auto runner = std::make_unique<testing::FakeModelRunner>(testing::fake_layout(kBlockSize, blocks, 1, 2), kWindow,
                                                             kVocab, 512);
    runner->replays_graphs = graphs;
    const testing::FakeModelRunner& fake = *runner;
    EngineConfig config = engine_config(adaptive ? adaptive_ngram(4, 1.0, 0.01, 0.005) : ngram(4), true);
    config.max_num_seqs = 16;
    if (blocks >= 100) config.max_num_batched_tokens = 256;
    Engine engine(config, std::move(runner), nullptr, std::vector<TokenId>{0});
    const Results results = run_batched(engine, requests);
    engine.shutdown(ShutdownMode::Drain);
    expect_same_outputs(results, reference);
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    if (blocks < 100) {
      EXPECT_GT(stats.preemptions_total, 0u);
    }
    std::printf("%s, decode graphs %d, %d blocks: %lld verify steps, %lld of them with prompt rows\n",
                adaptive ? "adaptive" : "fixed K", graphs, blocks, static_cast<long long>(fake.verify_steps),
                static_cast<long long>(fake.verify_steps_with_prompt_rows));
    return Counts{fake.verify_steps, fake.verify_steps_with_prompt_rows};
  };
  for (const bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "adaptive" : "fixed K");
    const Counts at_once = run(adaptive, false, 4000), held = run(adaptive, true, 4000);
    EXPECT_GT(held.verify_steps, 0);
    EXPECT_LT(5 * held.with_prompt_rows, 3 * at_once.with_prompt_rows)
        << "holding new prompts should cut the verify steps that carry prompt rows by 40%";
    run(adaptive, true, 60);
  }
}

// A drafter's context is committed right after each step's launch, every row of it (drafts included, so that the
// host's work overlaps the forward), and cut back to the verified positions once the drafts are settled: each next
// commit starts exactly where the run ends, so the context never holds a rejected draft and never has a gap. With fixed
// K and adaptive verification (whose plain steps are launched ahead); under preemption the outputs stay.
TEST(SpeculativeDecoding, DrafterContextIsCommittedAtLaunchAndCutToWhatWasVerified) {
  const auto requests = repetitive_requests(6, 40);
  const Results reference = run_without_speculation(requests);
  for (const bool adaptive : {false, true}) {
    for (const int32_t blocks : {4000, 60}) {
      SCOPED_TRACE(fmt::format("{}, {} blocks", adaptive ? "adaptive" : "fixed K", blocks));
      auto runner = std::make_unique<testing::FakeModelRunner>(testing::fake_layout(kBlockSize, blocks, 1, 2), kWindow,
                                                               kVocab, 512);
      runner->drafter_context = true;
      const testing::FakeModelRunner& fake = *runner;
      Engine engine(engine_config(adaptive ? adaptive_ngram(4, 1.0, 0.01, 0.005) : ngram(4), true), std::move(runner),
                    nullptr, std::vector<TokenId>{0});
      const Results results = run_batched(engine, requests);
      engine.shutdown(ShutdownMode::Drain);
      expect_same_outputs(results, reference);
      const EngineStats stats = engine.stats();
      EXPECT_GT(stats.spec_decode_num_draft_tokens_total, stats.spec_decode_num_accepted_tokens_total)
          << "no draft was rejected: the truncation would not be exercised";
      EXPECT_GT(fake.context_truncations, 0);
      EXPECT_GE(fake.context_commits, static_cast<int64_t>(stats.steps_total));
      // A preempted sequence is recomputed from its start or a prefix hit: there the run restarts (as the ring does).
      if (blocks >= 100) {
        EXPECT_EQ(fake.context_gaps, 0);
      } else {
        EXPECT_GT(stats.preemptions_total, 0u);
      }
      EXPECT_TRUE(fake.context_end.empty()) << "every finished sequence's context is forgotten";
    }
  }
}

TEST(SpeculativeDecoding, StopStringsAndMaxTokensAreNeverPassed) {
  // Token i decodes to the letter 'a' + i, so the text is the token sequence.
  std::vector<std::string> pieces;
  for (int i = 0; i < kVocab; ++i) pieces.push_back(std::string(1, static_cast<char>('a' + i)));
  auto tokenizer = std::make_shared<testing::FakeTokenizer>(pieces, std::vector<TokenId>{});
  auto requests = repetitive_requests(4, 16);
  for (GenerationRequest& request : requests) {
    request.detokenize = true;
    request.sampling.n = 1;
    request.sampling.stop = {"cb", "hh"};
  }
  auto engine = make_engine(engine_config(ngram(6), true), 4000, tokenizer);
  const Results results = run_batched(*engine, requests);
  EngineConfig plain = engine_config({}, true);
  plain.async_scheduling = false;
  auto reference_engine = make_engine(plain, 4000, tokenizer);
  const Results reference = run_batched(*reference_engine, requests);
  expect_same_outputs(results, reference);
  for (const GenerationRequest& request : requests) {
    const SampleOutput& sample = results.at(request.request_id).samples.at(0);
    EXPECT_EQ(sample.text, reference.at(request.request_id).samples.at(0).text);
    EXPECT_LE(static_cast<int32_t>(sample.token_ids.size()), *request.sampling.max_tokens);
  }
  engine->shutdown(ShutdownMode::Drain);
  EXPECT_GT(engine->stats().spec_decode_num_accepted_tokens_total, 0u);
}

// --- Lossless sampling -------------------------------------------------------------------------------------------

using FirstTokens = std::array<TokenId, 3>;

// The first three tokens of `samples` samples at temperature 1 with top-p 0.9 over a 4-token vocabulary whose
// distributions are flattened (so that many outputs are likely and drafts are often right): requests of n = 100, each
// sample on its own seed. The prompt holds every token, so the proposer always finds a draft after the
// first token (which the prompt's step samples): tokens 2 and 3 come from verified drafts or their corrections.
constexpr int32_t kChiSquareVocab = 4;
std::map<FirstTokens, int> sample_first_tokens(const SpeculativeConfig& speculative, uint64_t seed_base, int samples) {
  EngineConfig config = engine_config(speculative, true);
  config.max_num_seqs = 256;
  config.max_num_batched_tokens = 4096;
  auto engine = make_engine(config, 8000, nullptr, kChiSquareVocab, 0.25f);
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < samples / 100; ++r) {
    GenerationRequest request;
    request.request_id = fmt::format("chi{}", r);
    request.detokenize = false;
    request.prompt = {1, 3, 2, 0, 1, 2, 3, 0, 3, 1};
    request.sampling.n = 100;
    request.sampling.temperature = 1.0f;
    request.sampling.top_p = 0.9f;
    request.sampling.max_tokens = 4;
    request.sampling.ignore_eos = true;
    request.sampling.seed = seed_base + static_cast<uint64_t>(r) * 100;
    requests.push_back(std::move(request));
  }
  std::map<FirstTokens, int> counts;
  for (const auto& [id, output] : run_batched(*engine, requests)) {
    EXPECT_FALSE(output.error);
    for (const SampleOutput& sample : output.samples) {
      EXPECT_EQ(sample.token_ids.size(), 4u);
      if (sample.token_ids.size() == 4) ++counts[{sample.token_ids[0], sample.token_ids[1], sample.token_ids[2]}];
    }
  }
  engine->shutdown(ShutdownMode::Drain);
  if (speculative.enabled()) {
    const EngineStats stats = engine->stats();
    // The test bites only if drafts are often accepted (and often rejected).
    EXPECT_GT(stats.spec_decode_num_accepted_tokens_total, stats.spec_decode_num_draft_tokens_total / 10);
    EXPECT_LT(stats.spec_decode_num_accepted_tokens_total, stats.spec_decode_num_draft_tokens_total * 9 / 10);
  }
  return counts;
}

struct ChiSquare {
  double statistic = 0;
  int degrees_of_freedom = 0;
};

// Pearson's test that two samples come from one distribution; cells with fewer than 10 observations in both
// samples together are pooled into one.
ChiSquare homogeneity(const std::map<FirstTokens, int>& a, const std::map<FirstTokens, int>& b) {
  std::map<FirstTokens, std::pair<double, double>> cells;
  for (const auto& [key, count] : a) cells[key].first += count;
  for (const auto& [key, count] : b) cells[key].second += count;
  std::vector<std::pair<double, double>> kept;
  std::pair<double, double> pooled{0, 0};
  for (const auto& [key, counts] : cells) {
    if (counts.first + counts.second < 10) {
      pooled.first += counts.first;
      pooled.second += counts.second;
    } else {
      kept.push_back(counts);
    }
  }
  if (pooled.first + pooled.second > 0) kept.push_back(pooled);
  double total_a = 0, total_b = 0;
  for (const auto& [x, y] : kept) {
    total_a += x;
    total_b += y;
  }
  ChiSquare result;
  result.degrees_of_freedom = static_cast<int>(kept.size()) - 1;
  for (const auto& [x, y] : kept) {
    const double share = (x + y) / (total_a + total_b);
    result.statistic += (x - share * total_a) * (x - share * total_a) / (share * total_a);
    result.statistic += (y - share * total_b) * (y - share * total_b) / (share * total_b);
  }
  return result;
}

// The chi-square quantile at p = 0.001 (Wilson-Hilferty).
double critical_value(int degrees_of_freedom) {
  const double k = degrees_of_freedom, z = 3.090;
  const double term = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * term * term * term;
}

TEST(SpeculativeDecoding, SampledOutputsAreDistributedAsWithoutSpeculation) {
  constexpr int kSamples = 20000;
  const auto reference = sample_first_tokens({}, 1'000'000, kSamples);
  const auto speculative = sample_first_tokens(ngram(3), 2'000'000, kSamples);
  const ChiSquare exact = homogeneity(reference, speculative);
  ASSERT_GE(exact.degrees_of_freedom, 10) << "too few distinct outputs for the test to mean much";
  EXPECT_LT(exact.statistic, critical_value(exact.degrees_of_freedom))
      << "chi-square " << exact.statistic << " with " << exact.degrees_of_freedom << " degrees of freedom";

  // The same test must catch a rule that accepts drafts too often.
  SpeculativeConfig biased = ngram(3);
  biased.acceptance_for_testing = [](double p) { return std::min(1.0, 1.5 * p); };
  const ChiSquare caught = homogeneity(reference, sample_first_tokens(biased, 3'000'000, kSamples));
  EXPECT_GT(caught.statistic, critical_value(caught.degrees_of_freedom))
      << "chi-square " << caught.statistic << " with " << caught.degrees_of_freedom << " degrees of freedom";
  std::printf("chi-square: exact rule %.1f, biased rule %.1f (critical %.1f at p = 0.001, %d degrees of freedom)\n",
              exact.statistic, caught.statistic, critical_value(exact.degrees_of_freedom), exact.degrees_of_freedom);
}

}  // namespace
}  // namespace beamline
