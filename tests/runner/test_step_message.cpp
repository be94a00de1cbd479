// The step plan rank 0 broadcasts: a batch per data-parallel replica (or none) survives the round trip, stop is stop,
// a weight update's order too, and damaged bytes are refused.
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
  batch.capture_routed_experts = true;
  return batch;
}

TEST(StepMessage, BatchRoundTrip) {
  const ForwardBatch batch = some_batch();
  const ReplicaBatches plan{batch};
  const StepMessage decoded = decode_step_message(encode_step_message(&plan));
  ASSERT_EQ(decoded.kind, StepMessage::Kind::Step);
  ASSERT_EQ(decoded.plan.size(), 1u);
  const std::optional<ForwardBatch>& back = decoded.plan.front();
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
  EXPECT_TRUE(back->capture_routed_experts);
}

TEST(StepMessage, DataParallelPlanKeepsIdleReplicas) {
  const ReplicaBatches plan{std::nullopt, some_batch(), std::nullopt};
  const StepMessage message = decode_step_message(encode_step_message(&plan));
  const ReplicaBatches& back = message.plan;
  ASSERT_EQ(back.size(), 3u);
  EXPECT_FALSE(back[0].has_value());
  ASSERT_TRUE(back[1].has_value());
  EXPECT_EQ(back[1]->tokens, plan[1]->tokens);
  EXPECT_FALSE(back[2].has_value());
}

TEST(StepMessage, Stop) { EXPECT_EQ(decode_step_message(encode_step_message(nullptr)).kind, StepMessage::Kind::Stop); }

TEST(StepMessage, WeightUpdateRoundTrip) {
  WeightUpdateOrder order;
  order.directory = "/ckpt/step-1";
  order.tensors.push_back(TensorView{"model.layers.3.mlp.gate.weight", DType::BF16, {8, 64}, nullptr, 0});
  order.tensors.push_back(TensorView{"model.norm.weight", DType::F32, {64}, nullptr, 0});
  const StepMessage message = decode_step_message(encode_weight_update_message(order));
  ASSERT_EQ(message.kind, StepMessage::Kind::Weights);
  EXPECT_EQ(message.weights.directory, order.directory);
  ASSERT_EQ(message.weights.tensors.size(), 2u);
  EXPECT_EQ(message.weights.tensors[0].name, order.tensors[0].name);
  EXPECT_EQ(message.weights.tensors[0].dtype, DType::BF16);
  EXPECT_EQ(message.weights.tensors[0].shape, order.tensors[0].shape);
  EXPECT_EQ(message.weights.tensors[0].nbytes, 8u * 64u * 2u);
  EXPECT_EQ(message.weights.tensors[1].shape, order.tensors[1].shape);
  std::vector<std::byte> bytes = encode_weight_update_message(order);
  EXPECT_THROW(decode_step_message(std::span(bytes).first(bytes.size() - 4)), Error);
}

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
