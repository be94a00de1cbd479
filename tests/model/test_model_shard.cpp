// What each rank of a parallel layout computes, and the sizes that are refused naming the config key.
#include <gtest/gtest.h>

#include "checkpoint/presets.h"
#include "model/model_shard.h"
#include "util/error.h"

namespace beamline {
namespace {

std::string error_of(const ModelConfig& config, const ParallelConfig& parallel) {
  try {
    model_shard(config, parallel, {});
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(ModelShard, Beam10AtTp8Ep8) {
  const ModelConfig config = preset_config("beam-1.0");
  ParallelConfig parallel;
  parallel.tensor = 8;
  parallel.expert = true;
  const ModelShard shard = model_shard(config, parallel, {0, 0, 3});
  EXPECT_EQ(shard.q_heads, 6);
  EXPECT_EQ(shard.q_head_begin, 18);
  EXPECT_EQ(shard.kv_heads, 1);
  EXPECT_EQ(shard.kv_head_begin, 3);
  EXPECT_EQ(shard.expert_begin, 96);
  EXPECT_EQ(shard.expert_end, 128);
  EXPECT_EQ(shard.moe_size, config.moe_intermediate_size);
  EXPECT_EQ(shard.ffn_size, config.intermediate_size / 8);
  EXPECT_EQ(shard.vocab_size, config.vocab_size / 8);
  EXPECT_EQ(shard.vocab_begin, 3 * config.vocab_size / 8);
}

TEST(ModelShard, KvHeadsReplicatedPastTheirCount) {
  const ModelConfig config = preset_config("beam-1.0");  // 48 q heads, 8 KV heads
  ParallelConfig parallel;
  parallel.tensor = 16;
  const ModelShard shard = model_shard(config, parallel, {0, 0, 5});
  EXPECT_EQ(shard.q_heads, 3);
  EXPECT_EQ(shard.q_head_begin, 15);
  EXPECT_EQ(shard.kv_heads, 1);
  EXPECT_EQ(shard.kv_head_begin, 2);  // query heads 15..17 read KV head 15 / 6 = 2
  EXPECT_EQ(shard.moe_size, config.moe_intermediate_size / 16);
}

TEST(ModelShard, PipelineStagesAndDataParallelExperts) {
  ModelConfig config = preset_config("tiny");
  ParallelConfig parallel;
  parallel.pipeline = 2;
  parallel.data = 2;
  parallel.expert = true;
  const ModelShard shard = model_shard(config, parallel, {1, 1, 0});
  EXPECT_EQ(shard.layer_begin, 3);
  EXPECT_EQ(shard.layer_end, 6);
  EXPECT_EQ(shard.expert_begin, 4);
  EXPECT_EQ(shard.expert_end, 8);
  EXPECT_TRUE(model_shard(config, ParallelConfig{}, {}).whole_model(config));
}

TEST(ModelShard, SizesThatDoNotDivideNameTheKey) {
  const ModelConfig config = preset_config("tiny");  // 4 q heads, 2 KV heads, 6 layers, 8 experts
  ParallelConfig parallel;
  parallel.tensor = 3;
  EXPECT_NE(error_of(config, parallel).find("num_attention_heads"), std::string::npos);
  parallel.tensor = 1;
  parallel.pipeline = 4;
  EXPECT_NE(error_of(config, parallel).find("num_hidden_layers"), std::string::npos);
  parallel.pipeline = 1;
  ModelConfig odd_vocab = config;
  odd_vocab.vocab_size = 511;
  parallel.tensor = 2;
  EXPECT_NE(error_of(odd_vocab, parallel).find("vocab_size"), std::string::npos);
  ModelConfig six_experts = config;
  six_experts.n_routed_experts = 6;
  parallel.tensor = 4;
  parallel.expert = true;
  EXPECT_NE(error_of(six_experts, parallel).find("n_routed_experts"), std::string::npos);
  ModelConfig three_kv = config;
  three_kv.num_attention_heads = 12;
  three_kv.num_key_value_heads = 3;
  parallel.expert = false;
  EXPECT_NE(error_of(three_kv, parallel).find("num_key_value_heads"), std::string::npos);
}

}  // namespace
}  // namespace beamline
