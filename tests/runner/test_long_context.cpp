// A 1,048,576-token context on Beam-1.0's shapes cut to 12 layers (two full-attention layers) with an FP8 KV cache
// (docs/long-context.md), checked on the CPU without allocating a 1M-token tensor: the KV memory prediction, the KV
// cache manager's blocks for a 1M-token sequence prefilled in 16K-token chunks against it, and the pool addressing
// past 2^31 elements.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "checkpoint/presets.h"
#include "kv/kv_cache_layout.h"
#include "kv/kv_cache_manager.h"
#include "runner/kv_cache.h"

namespace beamline {
namespace {

constexpr int64_t kContext = 1048576;
constexpr int32_t kChunk = 16384;

ModelConfig beam12() { return with_num_layers(preset_config("beam-1.0"), 12); }

TEST(LongContext, Beam12HasTwoFullAttentionLayers) {
  const ModelConfig config = beam12();
  ASSERT_EQ(config.layer_types.size(), 12u);
  EXPECT_EQ(config.layer_types[5], LayerType::Full);
  EXPECT_EQ(config.layer_types[11], LayerType::Full);
  EXPECT_EQ(std::count(config.layer_types.begin(), config.layer_types.end(), LayerType::Full), 2);
  EXPECT_GE(config.max_position_embeddings, kContext);
}

TEST(LongContext, PredictionCountsFullLayersPerTokenAndSlidingLayersPerWindow) {
  const ModelConfig config = beam12();
  const KvCacheLayout layout = make_kv_cache_layout(config, 16, 0);
  const KvMemoryPrediction fp8 = predict_kv_memory(config, layout, DType::F8_E4M3, kContext);
  EXPECT_EQ(fp8.full_layers, 2);
  EXPECT_EQ(fp8.sliding_layers, 10);
  EXPECT_EQ(fp8.bytes_per_token, 2 * 2 * 8 * 128);  // 2 layers x K,V x 8 heads x 128, one byte each
  EXPECT_EQ(fp8.sliding_bytes, 10 * 512 * 2 * 8 * 128);
  EXPECT_EQ(fp8.bytes, int64_t{4} * 1024 * 1024 * 1024 + fp8.sliding_bytes);  // 4 GiB + 10 MiB
  EXPECT_EQ(fp8.block_bytes, 2 * 16 * 2 * 8 * 128);                              // 2 slots x 16 tokens
  EXPECT_EQ(fp8.full_blocks, kContext / 16 + 1);                                 // position kContext is next
  EXPECT_EQ(fp8.sliding_blocks, 5 * (512 / 16 + 1));                             // 5 groups of 2 sliding layers
  const KvMemoryPrediction bf16 = predict_kv_memory(config, layout, DType::BF16, kContext);
  EXPECT_EQ(bf16.bytes, 2 * fp8.bytes);
  // Short sequences: sliding layers hold what there is.
  EXPECT_EQ(predict_kv_memory(config, layout, DType::F8_E4M3, 100).sliding_bytes, 10 * 100 * 2 * 8 * 128);
}

// The manager's blocks for one sequence of (almost) 1M tokens, prefilled in chunks, then decoding: what the
// prediction says, at every decode step measured.
TEST(LongContext, ManagerHoldsThePredictedBlocksAtOneMillionTokens) {
  const ModelConfig config = beam12();
  // The pool the engine demands for --max-model-len 1048576 and 16K-token steps (resolve_engine_config).
  const kv::KvCacheManager probe(make_kv_cache_layout(config, 16, 1), static_cast<int32_t>(config.sliding_window), false);
  const int64_t blocks = probe.max_blocks_for_sequence(kContext, kChunk);
  const KvCacheLayout layout = make_kv_cache_layout(config, 16, static_cast<int32_t>(blocks));
  kv::KvCacheManager manager(layout, static_cast<int32_t>(config.sliding_window), true);
  const int32_t prompt = static_cast<int32_t>(kContext) - 8;
  std::vector<int32_t> tokens(static_cast<std::size_t>(kContext));
  std::iota(tokens.begin(), tokens.end(), 0);
  const kv::PrefixHit hit = manager.find_cached_prefix(std::span(tokens).first(prompt), "", true);
  ASSERT_EQ(hit.num_tokens, 0);
  for (int32_t done = 0; done < prompt; done += kChunk) {
    const int32_t chunk = std::min(kChunk, prompt - done);
    ASSERT_TRUE(manager.allocate(7, tokens, "", done, chunk, done == 0 ? &hit : nullptr)) << "at " << done;
    manager.commit(7, tokens, done + chunk);
  }
  for (int32_t length = prompt; length < kContext; ++length) {
    ASSERT_TRUE(manager.allocate(7, tokens, "", length, 1));
    const KvMemoryPrediction p = predict_kv_memory(config, layout, DType::F8_E4M3, length);
    EXPECT_EQ(manager.num_held_blocks(7), p.full_blocks + p.sliding_blocks) << "at " << length;
    manager.commit(7, tokens, length + 1);
  }
  EXPECT_EQ(static_cast<int64_t>(manager.block_tables(7).front().size()), kContext / 16);
}

// The pool of a 1M-token context passes 2^31 elements: the last element's offset, computed in 64 bits.
TEST(LongContext, PoolOffsetsPassTwoToTheThirtyFirst) {
  const ModelConfig config = beam12();
  const int64_t blocks = predict_kv_memory(config, make_kv_cache_layout(config, 16, 0), DType::F8_E4M3, kContext)
                             .full_blocks + 5 * 64;
  const int64_t slots = 2, block_size = 16, heads = config.num_key_value_heads, dim = config.head_dim;
  const int64_t last = kv_pool_offset(blocks - 1, slots - 1, block_size - 1, heads - 1, slots, block_size, heads, dim) +
                       dim - 1;
  EXPECT_EQ(last, blocks * slots * block_size * heads * dim - 1);
  EXPECT_GT(last, int64_t{INT32_MAX});
  // Block 65536 (the first past 2^31 elements), slot 1, position 3, kv head 5.
  EXPECT_EQ(kv_pool_offset(65536, 1, 3, 5, slots, block_size, heads, dim),
            int64_t{65536} * 32768 + 16384 + 3 * 1024 + 5 * 128);
}

}  // namespace
}  // namespace beamline
