// The Beam forward pass through the KV cache: prefill-then-decode (token by token and in chunks) equals one
// prefill; a batched varlen step equals each sequence alone; sliding groups keep only the window; bad
// batches are rejected.
#include <algorithm>
#include <numeric>

#include "backend/backend.h"
#include "backend/registry.h"
#include "checkpoint/presets.h"
#include "model/beam_model.h"
#include "model_test_support.h"
#include "runner/sequence_runner.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

std::vector<int32_t> some_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> tokens;
  uint32_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    tokens.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab)));
  }
  return tokens;
}

// Tiny with one KV head, odd query heads, a window of 4 and two dense layers.
ModelConfig narrow_config() {
  ModelConfig config = preset_config("tiny");
  config.num_attention_heads = 3;
  config.num_key_value_heads = 1;
  config.head_dim = 8;
  config.sliding_window = 4;
  config.first_k_dense_replace = 2;
  config.num_hidden_layers = 5;
  config.layer_types = {LayerType::Sliding, LayerType::Full, LayerType::Sliding, LayerType::Sliding, LayerType::Full};
  config.residual_scale = 0.3;
  return config;
}

void expect_logits_close(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) worst = std::max(worst, double{std::abs(actual[i] - expected[i])});
  EXPECT_LE(worst, tolerance) << what;
}

class BeamModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    config_ = GetParam() == "narrow" ? narrow_config() : preset_config(GetParam());
    weights_ = write_and_load(config_, dir_.path(), 7);
    backend_ = create_backend("cpu");
    model_ = std::make_unique<BeamModel>(weights_, *backend_);
  }
  std::vector<float> one_shot(const std::vector<int32_t>& tokens, DType kv_dtype = DType::F32) {
    const auto n = static_cast<int64_t>(tokens.size());
    SequenceRunner runner(*model_, n, n, kv_dtype);
    return runner.step(tokens, true);
  }
  std::vector<float> in_chunks(const std::vector<int32_t>& tokens, const std::vector<int64_t>& chunks,
                               DType kv_dtype = DType::F32) {
    const auto n = static_cast<int64_t>(tokens.size());
    SequenceRunner runner(*model_, n, *std::max_element(chunks.begin(), chunks.end()), kv_dtype);
    std::vector<float> logits;
    int64_t at = 0;
    for (std::size_t i = 0; at < n; ++i) {
      const int64_t size = std::min(chunks[i % chunks.size()], n - at);
      const std::vector<float> step = runner.step(std::span(tokens).subspan(at, size), true);
      logits.insert(logits.end(), step.begin(), step.end());
      at += size;
    }
    return logits;
  }

  TempDir dir_{"model"};
  ModelConfig config_;
  BeamWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BeamModel> model_;
};

TEST_P(BeamModelTest, PrefillThenDecodeEqualsOnePrefill) {
  const std::vector<int32_t> tokens = some_tokens(23, config_.vocab_size, 11);
  const std::vector<float> reference = one_shot(tokens);
  // Non-degenerate: positions differ from each other.
  const auto vocab = static_cast<std::size_t>(config_.vocab_size);
  EXPECT_NE(std::vector<float>(reference.begin(), reference.begin() + vocab),
            std::vector<float>(reference.end() - vocab, reference.end()));
  expect_logits_close(in_chunks(tokens, {1}), reference, 1e-4, "token by token");
  expect_logits_close(in_chunks(tokens, {5, 1, 7, 3}), reference, 1e-4, "chunks of 5, 1, 7, 3");
  expect_logits_close(in_chunks(tokens, {9, 1}), reference, 1e-4, "prefill 9 then decode");
}

TEST_P(BeamModelTest, Bf16KvCacheDecodeEqualsItsPrefill) {
  const std::vector<int32_t> tokens = some_tokens(17, config_.vocab_size, 12);
  const std::vector<float> reference = one_shot(tokens, DType::BF16);
  expect_logits_close(in_chunks(tokens, {1}, DType::BF16), reference, 1e-4, "bf16 token by token");
  expect_logits_close(one_shot(tokens), reference, 0.05, "bf16 vs f32 cache");
}

TEST_P(BeamModelTest, BatchedVarlenStepsEqualEachSequenceAlone) {
  const std::vector<std::vector<int32_t>> sequences{some_tokens(8, config_.vocab_size, 1),
                                                    some_tokens(17, config_.vocab_size, 2),
                                                    some_tokens(5, config_.vocab_size, 3)};
  const std::vector<std::vector<int64_t>> steps{{7, 12, 1}, {1, 5, 4}};  // tokens per sequence per step
  const int32_t block_size = default_block_size(config_), blocks_per_table = 8;
  KvCacheLayout layout = make_kv_cache_layout(config_, block_size, 0);
  layout.num_blocks = static_cast<int32_t>(sequences.size()) * layout.num_groups() * blocks_per_table;
  KvCache cache(*backend_, config_, layout);
  // Disjoint, interleaved blocks per sequence and group.
  auto table = [&](std::size_t s, int32_t group) {
    std::vector<int32_t> blocks;
    for (int32_t i = 0; i < blocks_per_table; ++i)
      blocks.push_back((i * layout.num_groups() + group) * static_cast<int32_t>(sequences.size()) +
                       static_cast<int32_t>(s));
    return blocks;
  };
  std::vector<std::vector<float>> batched(sequences.size());
  std::vector<int64_t> fed(sequences.size(), 0);
  for (const auto& step : steps) {
    ForwardBatch batch;
    for (std::size_t s = 0; s < sequences.size(); ++s) {
      SequenceSlice slice;
      slice.token_begin = static_cast<int32_t>(batch.tokens.size());
      batch.tokens.insert(batch.tokens.end(), sequences[s].begin() + fed[s], sequences[s].begin() + fed[s] + step[s]);
      slice.token_end = static_cast<int32_t>(batch.tokens.size());
      slice.context_begin = static_cast<int32_t>(fed[s]);
      for (int32_t g = 0; g < layout.num_groups(); ++g) slice.block_tables.push_back(table(s, g));
      for (int32_t row = slice.token_begin; row < slice.token_end; ++row) batch.logit_rows.push_back(row);
      batch.sequences.push_back(std::move(slice));
      fed[s] += step[s];
    }
    const std::vector<float> logits = backend_->download_f32(model_->forward(batch, cache));
    const auto vocab = static_cast<std::ptrdiff_t>(config_.vocab_size);
    for (std::size_t s = 0; s < sequences.size(); ++s) {
      const auto& slice = batch.sequences[s];
      batched[s].insert(batched[s].end(), logits.begin() + slice.token_begin * vocab,
                        logits.begin() + slice.token_end * vocab);
    }
  }
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const std::vector<int32_t> fed_tokens(sequences[s].begin(), sequences[s].begin() + fed[s]);
    expect_logits_close(batched[s], one_shot(fed_tokens), 1e-4, "sequence " + std::to_string(s));
  }
}

TEST_P(BeamModelTest, SlidingGroupsKeepOnlyTheWindow) {
  const std::vector<int32_t> tokens = some_tokens(70, config_.vocab_size, 13);
  const int64_t n = static_cast<int64_t>(tokens.size());
  SequenceRunner runner(*model_, n, 1);
  const KvCacheLayout& layout = runner.cache().layout();
  const auto sliding_groups = std::count(layout.group_is_sliding.begin(), layout.group_is_sliding.end(), true);
  const auto full_groups = layout.num_groups() - sliding_groups;
  ASSERT_GT(sliding_groups, 0);
  const int64_t window_blocks = (config_.sliding_window + layout.block_size - 1) / layout.block_size + 1;
  for (int64_t i = 0; i < n; ++i) {
    runner.step(std::span(tokens).subspan(i, 1), false);
    const int64_t all_blocks = (i + 1 + layout.block_size - 1) / layout.block_size;
    EXPECT_LE(runner.blocks_in_use(), full_groups * all_blocks + sliding_groups * std::min(all_blocks, window_blocks))
        << "after position " << i;
  }
}

// The inputs of a recorded decode graph: block tables widened past what the batch needs compute the same logits,
// and padding sequences follow the real ones with no blocks, position 0 and their rows appended to the logit rows.
TEST_P(BeamModelTest, WidenedAndPaddedStepInputs) {
  KvCacheLayout layout = make_kv_cache_layout(config_, default_block_size(config_), 16);
  KvCache cache(*backend_, config_, layout);
  ForwardBatch batch;
  batch.tokens = some_tokens(5, config_.vocab_size, 21);
  SequenceSlice slice{0, 5, 0, {}};
  const int32_t blocks = (5 + layout.block_size - 1) / layout.block_size;
  for (int32_t g = 0; g < layout.num_groups(); ++g) {
    slice.block_tables.emplace_back();
    for (int32_t b = 0; b < blocks; ++b) slice.block_tables.back().push_back(g * blocks + b);
  }
  batch.sequences.push_back(slice);
  batch.logit_rows = {4, 2};
  const std::vector<float> reference = backend_->download_f32(model_->forward(batch, cache));

  const std::vector<int64_t> widths(static_cast<std::size_t>(layout.num_groups()), 4);
  BeamModel::StepInputs widened = model_->prepare(batch, layout, 0, widths);
  model_->upload(widened);
  ASSERT_EQ(widened.block_tables.size(), widths.size());
  EXPECT_EQ(widened.block_tables[0].shape(), (std::vector<int64_t>{1, 4}));
  expect_logits_close(backend_->download_f32(model_->run(widened, cache)), reference, 1e-6, "widened tables");

  BeamModel::StepInputs padded = model_->prepare(batch, layout, 3, widths);
  model_->upload(padded);
  EXPECT_EQ(padded.rows, 7);
  EXPECT_EQ(padded.selected, 4);
  EXPECT_EQ(padded.attention.host_query_start, (std::vector<int32_t>{0, 5, 6, 7}));
  EXPECT_EQ(padded.attention.host_seq_lens, (std::vector<int32_t>{5, 1, 1}));
  EXPECT_EQ(backend_->download_i32(padded.logit_rows), (std::vector<int32_t>{4, 2, 5, 6}));
  std::vector<int32_t> expected_table(12, kNullBlock);
  std::copy(slice.block_tables[0].begin(), slice.block_tables[0].end(), expected_table.begin());
  EXPECT_EQ(backend_->download_i32(padded.block_tables[0]), expected_table);
  EXPECT_THROW(model_->prepare(batch, layout, 0, std::vector<int64_t>(widths.size(), 0)), Error);

  // A verify step's padding: sequences of its own rows (here 5 each), every row in the logit rows (as a verify step's
  // real sequences), so that the shape is the bucket's whatever the number of real sequences.
  BeamModel::StepInputs verify = model_->prepare(batch, layout, 3, widths, 5);
  model_->upload(verify);
  EXPECT_EQ(verify.rows, 15);
  EXPECT_EQ(verify.selected, 12);
  EXPECT_EQ(verify.attention.host_query_start, (std::vector<int32_t>{0, 5, 10, 15}));
  EXPECT_EQ(verify.attention.host_seq_lens, (std::vector<int32_t>{5, 5, 5}));
  EXPECT_EQ(verify.attention.host_positions,
            (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(backend_->download_i32(verify.logit_rows), (std::vector<int32_t>{4, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}));
  // Two real sequences of 5 rows, each row a logit row, padded to 3: the same inputs' size as one real sequence.
  ForwardBatch two = batch;
  two.tokens = some_tokens(10, config_.vocab_size, 22);
  two.sequences.push_back(SequenceSlice{5, 10, 0, slice.block_tables});
  for (auto* one : {&batch, &two}) {
    one->logit_rows.clear();
    for (int32_t r = 0; r < static_cast<int32_t>(one->tokens.size()); ++r) one->logit_rows.push_back(r);
  }
  const BeamModel::StepInputs one_real = model_->prepare(batch, layout, 3, widths, 5);
  const BeamModel::StepInputs two_real = model_->prepare(two, layout, 3, widths, 5);
  EXPECT_EQ(one_real.packed.size(), two_real.packed.size());
  EXPECT_EQ(one_real.selected, 15);
  EXPECT_EQ(two_real.selected, 15);
  EXPECT_EQ(backend_->download_i32(verify.block_tables[0]), expected_table);
  EXPECT_THROW(model_->prepare(batch, layout, 3, widths, 0), Error);
}

TEST_P(BeamModelTest, RejectsMalformedBatches) {
  KvCacheLayout layout = make_kv_cache_layout(config_, default_block_size(config_), 16);
  KvCache cache(*backend_, config_, layout);
  auto valid = [&] {
    ForwardBatch batch;
    batch.tokens = {1, 2, 3};
    SequenceSlice slice{0, 3, 0, {}};
    for (int32_t g = 0; g < layout.num_groups(); ++g) slice.block_tables.push_back({g});
    batch.sequences.push_back(slice);
    batch.logit_rows = {2};
    return batch;
  };
  EXPECT_NO_THROW(model_->forward(valid(), cache));
  ForwardBatch bad = valid();
  bad.tokens[1] = static_cast<int32_t>(config_.vocab_size);
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.tokens[0] = -1;
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.sequences[0].token_end = 2;
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.sequences[0].context_begin = 100;
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.sequences[0].block_tables.pop_back();
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.sequences[0].block_tables[0][0] = 16;
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.logit_rows = {3};
  EXPECT_THROW(model_->forward(bad, cache), Error);
  bad = valid();
  bad.tokens.clear();
  EXPECT_THROW(model_->forward(bad, cache), Error);
}

INSTANTIATE_TEST_SUITE_P(Configs, BeamModelTest, ::testing::Values("tiny", "narrow"));

}  // namespace
}  // namespace beamline::testing
