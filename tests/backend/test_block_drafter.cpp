// The dflash block drafter on every backend (cpu; cuda where built and present), over make-model's `tiny` target with
// a random drafter whose window (16) is shorter than the sequences:
//  - its block logits do not depend on how the context reached it: one prefill, or steps whose rows past the verified
//    length (rejected drafts) are left out and whose ring was overwritten by earlier blocks, give the same logits;
//  - on a device, the same logits as the CPU backend;
//  - through the engine, greedy outputs with dflash speculation equal those without, token for token: batched, with
//    preemption (a small KV pool) and with prefix-cache hits (whose positions have no features until recomputed).
// The cross-check against the float64 NumPy reference is tools/reference/check_drafter_against_beamline.py (CTest
// drafter_numpy_reference).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "engine_outputs.h"
#include "backend_test_support.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "engine/engine.h"
#include "engine/generation_config.h"
#include "runner/beam_model_runner.h"
#include "runner/sequence_runner.h"
#include "spec/block_drafter.h"

namespace beamline {
namespace {

namespace fs = std::filesystem;
using testing::BackendTest;

class BlockDrafterTest : public BackendTest {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / fmt::format("beamline-block-drafter-{}", ::getpid()));
    const ModelConfig target = preset_config("tiny");
    write_random_checkpoint(target, *root_ / "target", 11, DType::BF16);
    DrafterConfig drafter = random_drafter_config(target);
    drafter.sliding_window = 16;  // shorter than the sequences: the ring wraps, prefix hits wait for features
    write_random_drafter(drafter, *root_ / "drafter", 12, DType::BF16);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static fs::path target_dir() { return *root_ / "target"; }
  static fs::path drafter_dir() { return *root_ / "drafter"; }

  static std::vector<int32_t> random_tokens(uint32_t seed, int count) {
    std::mt19937 rng(seed);
    std::vector<int32_t> tokens;
    for (int i = 0; i < count; ++i) tokens.push_back(static_cast<int32_t>(rng() % 500));
    return tokens;
  }

  // The block logits at anchor tokens.size() - 1 on `backend`, the context committed in steps of the given sizes. Each
  // step's target pass runs over every verified token so far plus `rejected` tokens after them (as a draft's rejected
  // rows) and only the step's new verified rows are committed; a block is drafted between steps, as in serving.
  static std::vector<float> block_logits(Backend& backend, const std::vector<int32_t>& tokens,
                                         const std::vector<int32_t>& steps, int32_t rejected) {
    const BeamWeights weights = load_checkpoint(target_dir());
    BeamModel model(weights, backend);
    const auto anchor = static_cast<int32_t>(tokens.size()) - 1;
    BlockDrafter drafter(load_drafter_checkpoint(drafter_dir(), weights.config, 7), model, 4);
    int32_t fed = 0;
    for (const int32_t size : steps) {
      std::vector<int32_t> rows(tokens.begin(), tokens.begin() + fed + size);
      for (int32_t r = 0; r < rejected; ++r) rows.push_back((fed + r) % 97);
      SequenceRunner runner(model, static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.size()));
      runner.step(rows, false);
      const VerifiedRows verified{3, fed, fed, size};
      drafter.commit(std::span(&verified, 1), model.captured_hidden());
      fed += size;
      const DraftAnchor between{3, fed, tokens[static_cast<std::size_t>(fed)]};
      if (fed < anchor) {
        EXPECT_EQ(drafter.block_logits(std::span(&between, 1), 7).drafting.size(), 1u);
      }
    }
    EXPECT_EQ(fed, anchor);
    const DraftAnchor draft{3, anchor, tokens.back()};
    const BlockDrafter::BlockLogits pass = drafter.block_logits(std::span(&draft, 1), 7);
    EXPECT_EQ(pass.drafting.size(), 1u);
    return pass.drafting.empty() ? std::vector<float>() : backend.download_f32(pass.logits);
  }

  static EngineConfig engine_config(int64_t kv_bytes, const SpeculativeConfig& speculative) {
    EngineConfig c;
    c.max_model_len = 200;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.kv_cache_memory_bytes = kv_bytes;
    c.enable_prefix_caching = true;
    c.dtype = "float32";  // greedy ties on a device must not depend on the rows a step has
    c.speculative = speculative;
    return c;
  }

  std::unique_ptr<Engine> engine(int64_t kv_bytes, const SpeculativeConfig& speculative = {}) {
    const EngineConfig c = engine_config(kv_bytes, speculative);
    auto runner = std::make_unique<BeamModelRunner>(load_checkpoint(target_dir()), GetParam(), c);
    const GenerationConfig generation = GenerationConfig::load(target_dir(), runner->model_config());
    return std::make_unique<Engine>(c, std::move(runner), nullptr, generation.eos_token_ids);
  }

  static std::vector<GenerationRequest> requests(uint32_t seed, int count) {
    std::mt19937 rng(seed);
    std::vector<GenerationRequest> out;
    for (int i = 0; i < count; ++i) {
      GenerationRequest r;
      r.request_id = fmt::format("r{}-{}", seed, i);
      r.detokenize = false;
      r.prompt = random_tokens(seed * 100 + static_cast<uint32_t>(i), 3 + static_cast<int>(rng() % 60));
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = 30 + static_cast<int32_t>(rng() % 20);
      r.sampling.ignore_eos = true;
      out.push_back(std::move(r));
    }
    return out;
  }

  static fs::path* root_;
};

fs::path* BlockDrafterTest::root_ = nullptr;

TEST_P(BlockDrafterTest, LogitsDoNotDependOnHowTheContextArrived) {
  const std::vector<int32_t> tokens = random_tokens(1, 58);
  const std::vector<float> one_prefill = block_logits(backend(), tokens, {57}, 0);
  // Steps of a decode with drafts: a few rows verified, three rejected after them, blocks drafted in between; the
  // ring (32 positions) wraps.
  const std::vector<float> in_steps = block_logits(backend(), tokens, {20, 5, 1, 9, 3, 6, 4, 2, 7}, 3);
  ASSERT_EQ(one_prefill.size(), in_steps.size());
  std::vector<double> expected(one_prefill.begin(), one_prefill.end());
  testing::expect_close(in_steps, expected, 2e-4, "block logits fed in steps vs one prefill");
}

TEST_P(BlockDrafterTest, DeviceLogitsMatchTheCpu) {
  if (backend().device() == Device::Cpu) GTEST_SKIP() << "the CPU backend is the reference";
  const std::vector<int32_t> tokens = random_tokens(2, 41);
  backend().set_compute_dtype(ComputeDType::Float32);
  const std::unique_ptr<Backend> cpu = create_backend("cpu");
  const std::vector<float> reference = block_logits(*cpu, tokens, {30, 10}, 2);
  const std::vector<float> device = block_logits(backend(), tokens, {30, 10}, 2);
  std::vector<double> expected(reference.begin(), reference.end());
  testing::expect_close(device, expected, 1e-3, "block logits, device vs cpu");
}

// On a backend with graphs the pass is recorded once per shape and replayed: three sequences decoding one token a step,
// drafted together after every step (a recorded pass of four blocks, the fourth padding on the spare ring slot), give
// the block logits of a drafter that runs every pass op by op (while the window grows past the ring and after it
// wraps), and the later passes replay.
TEST_P(BlockDrafterTest, RecordedPassesGiveTheLogitsOfOpByOpPasses) {
  if (!backend().supports_graphs()) GTEST_SKIP() << "the " << GetParam() << " backend records no graphs";
  backend().set_compute_dtype(ComputeDType::Float32);
  const BeamWeights weights = load_checkpoint(target_dir());
  BeamModel model(weights, backend());
  BlockDrafter eager(load_drafter_checkpoint(drafter_dir(), weights.config, 7), model, 4, false);
  BlockDrafter graphed(load_drafter_checkpoint(drafter_dir(), weights.config, 7), model, 4, true);
  const std::array<std::vector<int32_t>, 3> tokens{random_tokens(3, 60), random_tokens(4, 60), random_tokens(6, 60)};
  const std::array<int64_t, 3> ids{3, 5, 8};
  // Sequence s's rows [from, to) through the target (the whole prefix, as a recomputation), committed to both.
  auto commit = [&](std::size_t s, int32_t from, int32_t to) {
    const std::vector<int32_t> rows(tokens[s].begin(), tokens[s].begin() + to);
    SequenceRunner runner(model, to, to);
    runner.step(rows, false);
    const VerifiedRows verified{ids[s], from, from, to - from};
    eager.commit(std::span(&verified, 1), model.captured_hidden());
    graphed.commit(std::span(&verified, 1), model.captured_hidden());
  };
  for (std::size_t s = 0; s < tokens.size(); ++s) commit(s, 0, 20);
  for (int32_t fed = 20; fed + 1 < 60; ++fed) {
    std::array<DraftAnchor, 3> anchors;
    for (std::size_t s = 0; s < tokens.size(); ++s)
      anchors[s] = DraftAnchor{ids[s], fed, tokens[s][static_cast<std::size_t>(fed)]};
    const BlockDrafter::BlockLogits expected = eager.block_logits(anchors, 7);
    const BlockDrafter::BlockLogits actual = graphed.block_logits(anchors, 7);
    ASSERT_EQ(expected.drafting.size(), 3u) << "at " << fed;
    ASSERT_EQ(actual.drafting, expected.drafting) << "at " << fed;
    ASSERT_EQ(actual.logits.dim(0), expected.logits.dim(0)) << "at " << fed;
    const std::vector<float> reference = backend().download_f32(expected.logits);
    testing::expect_close(backend().download_f32(actual.logits),
                          std::vector<double>(reference.begin(), reference.end()), 1e-4,
                          fmt::format("block logits at {}, recorded vs op by op", fed));
    for (std::size_t s = 0; s < tokens.size(); ++s) commit(s, fed, fed + 1);
  }
  EXPECT_EQ(eager.recorded() + eager.replayed(), 0);
  EXPECT_GT(graphed.replayed(), 30);
  EXPECT_LE(graphed.recorded(), 4);
}

TEST_P(BlockDrafterTest, GreedyOutputsEqualThoseWithoutSpeculation) {
  auto first_turns = requests(3, 10);
  std::vector<GenerationRequest> second_turns;  // earlier prompts + more tokens: prefix-cache hits
  for (std::size_t i = 0; i < first_turns.size(); i += 2) {
    second_turns.push_back(first_turns[i]);
    second_turns.back().request_id += "-turn2";
    const std::vector<int32_t> more = random_tokens(900 + static_cast<uint32_t>(i), 30);
    second_turns.back().prompt.insert(second_turns.back().prompt.end(), more.begin(), more.end());
  }
  auto plain = engine(int64_t{8} << 20);
  const auto expected_first = testing::token_ids_together(*plain, first_turns);
  const auto expected_second = testing::token_ids_together(*plain, second_turns);
  plain->shutdown(ShutdownMode::Drain);

  // Fixed K (every step drafts), and adaptive verification (this random drafter's drafts are rejected, so most steps
  // go without drafts: on a device they replay decode graphs, which hand the drafter its hidden states).
  for (const bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "adaptive" : "fixed K");
    const SpeculativeConfig dflash = parse_speculative_config(
        fmt::format(R"({{"method": "dflash", "model": "{}", "num_speculative_tokens": 7, "adaptive_verification": {}}})",
                    drafter_dir().string(), adaptive));
    // A pool too small for ten at once: preemption, recomputed sequences.
    auto small = engine(48 * 4096, dflash);
    EXPECT_EQ(testing::token_ids_together(*small, first_turns), expected_first);
    small->shutdown(ShutdownMode::Drain);
    EXPECT_GT(small->stats().preemptions_total, 0u);
    EXPECT_GT(small->stats().spec_decode_num_drafts_total, 0u);

    auto cached = engine(int64_t{8} << 20, dflash);
    EXPECT_EQ(testing::token_ids_together(*cached, first_turns), expected_first);
    EXPECT_EQ(testing::token_ids_together(*cached, second_turns), expected_second);
    cached->shutdown(ShutdownMode::Drain);
    const EngineStats stats = cached->stats();
    EXPECT_GT(stats.prefix_cache_hits_total, 0u);
    EXPECT_GT(stats.spec_decode_num_draft_tokens_total, 0u);
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    std::printf("%s, random dflash drafter K=7%s: %llu drafts, %llu of %llu draft tokens accepted, %llu steps for "
                "%llu tokens\n",
                GetParam().c_str(), adaptive ? " adaptive" : "",
                static_cast<unsigned long long>(stats.spec_decode_num_drafts_total),
                static_cast<unsigned long long>(stats.spec_decode_num_accepted_tokens_total),
                static_cast<unsigned long long>(stats.spec_decode_num_draft_tokens_total),
                static_cast<unsigned long long>(stats.steps_total),
                static_cast<unsigned long long>(stats.generation_tokens_total));
  }
}

// Plain decode steps replay recorded decode graphs where the backend has them, and the graphs write the hidden states
// the drafter reads into buffers of their own: the drafts after such steps (tokens and the drafter's confidence in
// them) are those after the same steps run op by op.
TEST_P(BlockDrafterTest, DecodeGraphStepsGiveTheDrafterTheSameContext) {
  if (!backend().supports_graphs()) GTEST_SKIP() << "the " << GetParam() << " backend records no graphs";
  const SpeculativeConfig dflash = parse_speculative_config(
      fmt::format(R"({{"method": "dflash", "model": "{}", "num_speculative_tokens": 7}})", drafter_dir().string()));
  const BeamWeights weights = load_checkpoint(target_dir());
  EngineConfig eager_config = engine_config(int64_t{8} << 20, dflash);
  eager_config.enforce_eager = true;
  BeamModelRunner eager(weights, GetParam(), eager_config);
  BeamModelRunner graphed(weights, GetParam(), engine_config(int64_t{8} << 20, dflash));
  const std::vector<int32_t> tokens = random_tokens(5, 48);

  // One sequence (id 9): a prompt of 20, then one token per step; after each step its context is committed and a
  // draft proposed at the next token.
  auto drafts_after_each_step = [&](BeamModelRunner& runner) {
    const KvCacheLayout& layout = runner.kv_layout();
    const auto per_group = static_cast<int32_t>((tokens.size() + layout.block_size - 1) / layout.block_size);
    std::vector<DraftProposal> drafts;
    int32_t fed = 0;
    auto step = [&](int32_t count) {
      ForwardBatch batch;
      batch.tokens.assign(tokens.begin() + fed, tokens.begin() + fed + count);
      SequenceSlice slice{0, count, fed, {}};
      for (int32_t group = 0; group < layout.num_groups(); ++group) {
        std::vector<int32_t>& table = slice.block_tables.emplace_back();
        for (int32_t b = 0; b * layout.block_size < fed + count; ++b) table.push_back(group * per_group + b);
      }
      batch.sequences.push_back(std::move(slice));
      batch.logit_rows = {count - 1};
      std::unique_ptr<ModelStep> launched = runner.launch(batch);
      std::vector<RowSampling> rows(1);
      rows[0].settings.greedy = true;
      launched->sample(std::move(rows));
      launched->tokens();
      fed += count;
      const StepVerified verified{9, 0, fed};
      runner.commit_draft_context(std::span(&verified, 1));
      const DraftRequest request{9, fed, tokens[static_cast<std::size_t>(fed)]};
      drafts.push_back(runner.propose_drafts(std::span(&request, 1), 7).at(0));
    };
    step(20);
    while (fed + 1 < static_cast<int32_t>(tokens.size())) step(1);
    return drafts;
  };
  const std::vector<DraftProposal> expected = drafts_after_each_step(eager);
  const std::vector<DraftProposal> replayed = drafts_after_each_step(graphed);
  ASSERT_EQ(replayed.size(), expected.size());
  for (std::size_t s = 0; s < expected.size(); ++s) {
    ASSERT_EQ(expected[s].tokens.size(), 7u) << "step " << s;
    EXPECT_EQ(replayed[s].tokens, expected[s].tokens) << "step " << s;
    // As log-probabilities: a random drafter's confidences are tiny.
    std::vector<float> actual;
    std::vector<double> reference;
    for (const float c : replayed[s].confidence) actual.push_back(std::log(c));
    for (const float c : expected[s].confidence) reference.push_back(std::log(c));
    testing::expect_close(actual, reference, 1e-3, fmt::format("draft log-confidences after step {}", s));
  }
}

TEST_P(BlockDrafterTest, ADrafterThatDoesNotFitStopsStartUpNamingTheKey) {
  const fs::path bad = *root_ / fmt::format("bad-{}", GetParam());
  DrafterConfig drafter = random_drafter_config(preset_config("tiny"));
  drafter.target_layer_ids = {0, 9};
  write_random_drafter(drafter, bad, 1, DType::BF16);
  const SpeculativeConfig dflash = parse_speculative_config(
      fmt::format(R"({{"method": "dflash", "model": "{}", "num_speculative_tokens": 7}})", bad.string()));
  try {
    engine(int64_t{8} << 20, dflash);
    FAIL() << "a drafter reading target layer 9 of 6 started";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("dflash_config.target_layer_ids[1]"), std::string::npos) << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockDrafterTest, ::testing::ValuesIn(testing::backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace beamline
