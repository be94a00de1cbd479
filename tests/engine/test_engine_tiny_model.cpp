// The engine over the real model (make-model's `tiny` preset, random weights, CPU backend): batched greedy
// outputs equal one-at-a-time outputs, also under preemption, chunked prefill and prefix-cache hits, and with
// speculative decoding (n-gram drafts verified as extra query rows of the real model's batched forward).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "engine_outputs.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "engine/engine.h"
#include "engine/generation_config.h"
#include "runner/beam_model_runner.h"

namespace beamline {
namespace {

class TinyModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     fmt::format("beamline-engine-tiny-{}", ::getpid()));
    write_random_checkpoint(preset_config("tiny"), *dir_, 7, DType::BF16);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static EngineConfig config(int64_t kv_bytes, bool prefix_caching) {
    EngineConfig c;
    c.max_model_len = 200;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 48;
    c.kv_cache_memory_bytes = kv_bytes;
    c.enable_prefix_caching = prefix_caching;
    return c;
  }

  static std::unique_ptr<Engine> engine(int64_t kv_bytes, bool prefix_caching, bool async_scheduling = true,
                                        const SpeculativeConfig& speculative = {}) {
    EngineConfig c = config(kv_bytes, prefix_caching);
    c.async_scheduling = async_scheduling;
    c.speculative = speculative;
    auto runner = std::make_unique<BeamModelRunner>(load_checkpoint(*dir_), "cpu", c);
    const GenerationConfig generation = GenerationConfig::load(*dir_, runner->model_config());
    return std::make_unique<Engine>(c, std::move(runner), nullptr, generation.eos_token_ids);
  }

  static std::vector<GenerationRequest> requests(uint32_t seed, int count) {
    std::mt19937 rng(seed);
    std::vector<GenerationRequest> out;
    for (int i = 0; i < count; ++i) {
      GenerationRequest r;
      r.request_id = fmt::format("tiny{}", i);
      r.detokenize = false;
      for (int t = 0, n = 3 + static_cast<int>(rng() % 70); t < n; ++t) r.prompt.push_back(static_cast<TokenId>(rng() % 400));
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = 12 + static_cast<int32_t>(rng() % 12);
      r.sampling.ignore_eos = true;
      out.push_back(std::move(r));
    }
    return out;
  }

  static std::map<std::string, std::vector<TokenId>> run_alone(const std::vector<GenerationRequest>& rs) {
    auto e = engine(int64_t{8} << 20, false, /*async_scheduling=*/false);  // the reference: the synchronous loop
    std::map<std::string, std::vector<TokenId>> out;
    for (const auto& r : rs) out[r.request_id] = collect_output(*e->add_request(r)).samples.at(0).token_ids;
    return out;
  }

  static std::filesystem::path* dir_;
};

std::filesystem::path* TinyModel::dir_ = nullptr;

TEST_F(TinyModel, BatchedGreedyEqualsOneAtATime) {
  const auto rs = requests(1, 10);
  auto e = engine(int64_t{8} << 20, true);
  const auto batched = testing::token_ids_together(*e, rs);
  EXPECT_EQ(batched, run_alone(rs));
  e->shutdown(ShutdownMode::Drain);
  EXPECT_EQ(e->stats().requests_finished_total, 10u);
}

// The real model reads the deferred tokens through Backend::place_tokens (and the CPU backend's sampling); the other
// tests here run --async-scheduling too (the default), this one without prefix caching.
TEST_F(TinyModel, AsyncSchedulingEqualsOneAtATime) {
  const auto rs = requests(4, 10);
  auto e = engine(int64_t{8} << 20, false, true);
  EXPECT_EQ(testing::token_ids_together(*e, rs), run_alone(rs));
  e->shutdown(ShutdownMode::Drain);
  EXPECT_EQ(e->stats().requests_finished_total, 10u);
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

TEST_F(TinyModel, PreemptionKeepsGreedyOutputs) {
  const auto rs = requests(2, 10);
  // 4 KiB blocks: 48 hold one 200-token sequence (25 full + 2 x 8 sliding) but not eight running at once.
  auto e = engine(48 * 4096, true);
  const auto batched = testing::token_ids_together(*e, rs);
  e->shutdown(ShutdownMode::Drain);
  EXPECT_GT(e->stats().preemptions_total, 0u);
  EXPECT_EQ(batched, run_alone(rs));
}

TEST_F(TinyModel, PrefixCacheHitsKeepGreedyOutputs) {
  const auto first_turns = requests(3, 5);
  auto second_turns = requests(4, 5);
  for (std::size_t i = 0; i < second_turns.size(); ++i) {  // earlier prompt + 9 more tokens, as in a chat
    second_turns[i].request_id += "-turn2";
    auto prompt = first_turns[i].prompt;
    prompt.insert(prompt.end(), second_turns[i].prompt.begin(),
                  second_turns[i].prompt.begin() + std::min<std::size_t>(9, second_turns[i].prompt.size()));
    second_turns[i].prompt = prompt;
  }
  auto e = engine(int64_t{8} << 20, true);
  testing::token_ids_together(*e, first_turns);
  const auto batched = testing::token_ids_together(*e, second_turns);
  e->shutdown(ShutdownMode::Drain);
  uint64_t expected_hits = 0;  // full blocks of each first-turn prompt (it never ends exactly on a block: +9 tokens)
  for (const auto& r : first_turns) expected_hits += r.prompt.size() / 8 * 8;
  EXPECT_EQ(e->stats().prefix_cache_hits_total, expected_hits);
  EXPECT_EQ(batched, run_alone(second_turns));
}

TEST_F(TinyModel, SpeculativeDecodingKeepsGreedyOutputs) {
  // Prompts that repeat a phrase, so n-gram drafts are found, and half of them again as second turns.
  auto rs = requests(5, 8);
  std::mt19937 rng(5);
  for (auto& r : rs) {
    std::vector<TokenId> phrase(r.prompt.begin(), r.prompt.begin() + std::min<std::size_t>(r.prompt.size(), 2 + rng() % 6));
    r.prompt.clear();
    for (int i = 0; i < 4; ++i) r.prompt.insert(r.prompt.end(), phrase.begin(), phrase.end());
    r.sampling.max_tokens = 40;
  }
  std::vector<GenerationRequest> second;
  for (std::size_t i = 0; i < rs.size(); i += 2) {
    second.push_back(rs[i]);
    second.back().request_id += "-turn2";
    second.back().prompt.insert(second.back().prompt.end(), {7, 8, 9, 10, 11, 12, 13, 14, 15});
  }
  const SpeculativeConfig speculative = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 4, )"
      R"("adaptive_verification": false})");  // every draft verified: the counts below do not depend on step times
  // A pool too small for all at once: preemption.
  auto small = engine(48 * 4096, true, true, speculative);
  const auto batched = testing::token_ids_together(*small, rs);
  small->shutdown(ShutdownMode::Drain);
  EXPECT_GT(small->stats().preemptions_total, 0u);
  EXPECT_EQ(batched, run_alone(rs));
  // A pool that keeps the first turns cached: prefix hits.
  auto e = engine(int64_t{8} << 20, true, true, speculative);
  testing::token_ids_together(*e, rs);
  const auto batched_second = testing::token_ids_together(*e, second);
  e->shutdown(ShutdownMode::Drain);
  EXPECT_EQ(batched_second, run_alone(second));
  const EngineStats stats = e->stats();
  EXPECT_GT(stats.prefix_cache_hits_total, 0u);
  EXPECT_GT(stats.spec_decode_num_accepted_tokens_total, 0u) << "no draft was accepted: the test would not bite";
  std::printf("tiny model, ngram K=5: %llu drafts, %llu of %llu draft tokens accepted, %llu engine steps for %llu tokens\n",
              static_cast<unsigned long long>(stats.spec_decode_num_drafts_total),
              static_cast<unsigned long long>(stats.spec_decode_num_accepted_tokens_total),
              static_cast<unsigned long long>(stats.spec_decode_num_draft_tokens_total),
              static_cast<unsigned long long>(stats.steps_total),
              static_cast<unsigned long long>(stats.generation_tokens_total));
}

}  // namespace
}  // namespace beamline
