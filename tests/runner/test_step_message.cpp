// The step plan rank 0 broadcasts: a batch per data-parallel replica (or none) survives the round trip, stop is stop,
// and damaged bytes are refused.
#include <gtest/gtest.h>

#include "runner/step_message.h"
#include "util/error.h"

namespace beamline {
namespace {

ForwardBatch some_batch() {
  ForwardBatch batch;
  batch.tokens = {5, 6, 7, 8};
  SequenceSlice first{0, 3, 0, {{1, 2}, {3}}};
  SequenceSlice second{3, 4, 9, {{4, kNullBlock, 6}, {}}};
  batch.sequences = {first, second};
  batch.logit_rows = {2, 3};
  batch.deferred_tokens = {{3, 1}};
  return batch;
}

TEST(StepMessage, BatchRoundTrip) {
  const ForwardBatch batch = some_batch();
  const ReplicaBatches plan{batch};
  const std::optional<ReplicaBatches> decoded = decode_step_message(encode_step_message(&plan));
  ASSERT_TRUE(decoded.has_value());
  ASSERT_EQ(decoded->size(), 1u);
  const std::optional<ForwardBatch>& back = decoded->front();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->tokens, batch.tokens);
  ASSERT_EQ(back->sequences.size(), 2u);
  EXPECT_EQ(back->sequences[1].context_begin, 9);
  EXPECT_EQ(back->sequences[1].block_tables, batch.sequences[1].block_tables);
  EXPECT_EQ(back->sequences[0].block_tables, batch.sequences[0].block_tables);
  EXPECT_EQ(back->logit_rows, batch.logit_rows);
  ASSERT_EQ(back->deferred_tokens.size(), 1u);
  EXPECT_EQ(back->deferred_tokens[0].row, 3);
  EXPECT_EQ(back->deferred_tokens[0].source, 1);
}

TEST(StepMessage, DataParallelPlanKeepsIdleReplicas) {
  const ReplicaBatches plan{std::nullopt, some_batch(), std::nullopt};
  const std::optional<ReplicaBatches> back = decode_step_message(encode_step_message(&plan));
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->size(), 3u);
  EXPECT_FALSE((*back)[0].has_value());
  ASSERT_TRUE((*back)[1].has_value());
  EXPECT_EQ((*back)[1]->tokens, plan[1]->tokens);
  EXPECT_FALSE((*back)[2].has_value());
}

TEST(StepMessage, Stop) { EXPECT_FALSE(decode_step_message(encode_step_message(nullptr)).has_value()); }

TEST(StepMessage, DamagedBytesAreRefused) {
  const ReplicaBatches plan{some_batch()};
  std::vector<std::byte> bytes = encode_step_message(&plan);
  EXPECT_THROW(decode_step_message(std::span(bytes).first(bytes.size() - 4)), Error);
  bytes.push_back(std::byte{0});
  EXPECT_THROW(decode_step_message(bytes), Error);
  bytes[0] = std::byte{9};
  EXPECT_THROW(decode_step_message(bytes), Error);
}

}  // namespace
}  // namespace beamline
