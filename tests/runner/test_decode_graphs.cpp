// Which steps DecodeGraphs takes: only batches whose sequences have the same number of rows (one-token decodes, or
// verify steps with as many drafts each) whose logits are all wanted in order, up to its largest bucket. The recording itself needs a device backend (bench/serve_check.py compares it with eager steps
// on the GPU); on the CPU backend an eligible batch runs op by op and then reaches begin_capture, which says that it
// records no graphs.
#include "runner/decode_graphs.h"

#include "backend/backend.h"
#include "backend/registry.h"
#include "checkpoint/presets.h"
#include "../model/model_test_support.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

class DecodeGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = preset_config("tiny");
    weights_ = write_and_load(config_, dir_.path(), 3);
    backend_ = create_backend("cpu");
    model_ = std::make_unique<BeamModel>(weights_, *backend_);
    layout_ = make_kv_cache_layout(config_, default_block_size(config_), 64);
    cache_ = std::make_unique<KvCache>(*backend_, config_, layout_);
  }

  // `sequences` sequences decoding `rows` tokens each (one, or a verify step's 1 + k) from position 4 (blocks of their
  // own per group), every row a logit row.
  ForwardBatch decode_batch(int32_t sequences, int32_t rows = 1) const {
    ForwardBatch batch;
    for (int32_t s = 0; s < sequences; ++s) {
      SequenceSlice slice{s * rows, (s + 1) * rows, 4, {}};
      for (int32_t g = 0; g < layout_.num_groups(); ++g) slice.block_tables.push_back({s * layout_.num_groups() + g});
      batch.sequences.push_back(slice);
      for (int32_t r = 0; r < rows; ++r) {
        batch.tokens.push_back(s + r + 1);
        batch.logit_rows.push_back(s * rows + r);
      }
    }
    return batch;
  }

  TempDir dir_{"decode_graphs"};
  ModelConfig config_;
  BeamWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BeamModel> model_;
  KvCacheLayout layout_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(DecodeGraphsTest, DeclinesStepsThatAreNotPlainDecode) {
  DecodeGraphs graphs(*model_, *cache_, 4);
  ForwardBatch prefill = decode_batch(2);
  prefill.tokens.push_back(7);  // the last sequence gets a second token
  prefill.sequences.back().token_end = 3;
  prefill.logit_rows = {0, 2};
  EXPECT_FALSE(graphs.forward(prefill).has_value());

  ForwardBatch reordered = decode_batch(2);
  reordered.logit_rows = {1, 0};
  EXPECT_FALSE(graphs.forward(reordered).has_value());

  ForwardBatch fewer_logits = decode_batch(2);
  fewer_logits.logit_rows = {1};
  EXPECT_FALSE(graphs.forward(fewer_logits).has_value());

  ForwardBatch last_rows_only = decode_batch(2, 3);  // three rows each, but logits of the last only
  last_rows_only.logit_rows = {2, 5};
  EXPECT_FALSE(graphs.forward(last_rows_only).has_value());

  EXPECT_FALSE(graphs.forward(decode_batch(5)).has_value());  // past the largest bucket (max_batch 4)
  EXPECT_EQ(graphs.recorded(), 0);
  EXPECT_EQ(graphs.replayed(), 0);
}

TEST_F(DecodeGraphsTest, AnEligibleStepAsksTheBackendToRecord) {
  DecodeGraphs graphs(*model_, *cache_, 4);
  // A full bucket (no padding rows, which the CPU's attention refuses): the step runs, then recording fails.
  EXPECT_THROW(graphs.forward(decode_batch(4)), Error);  // the CPU backend records no op graphs
  // So is a verify step: the same rows for every sequence (here 1 + 2 drafts), all of them logit rows.
  EXPECT_THROW(graphs.forward(decode_batch(4, 3)), Error);
  EXPECT_EQ(graphs.recorded(), 0);
  EXPECT_THROW(DecodeGraphs(*model_, *cache_, 0), Error);
}

}  // namespace
}  // namespace beamline::testing
