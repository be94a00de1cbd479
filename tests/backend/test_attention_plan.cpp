// The CUDA attention plan's host side, on any machine: an FP8 pool's prefill tiles at a 1M-token context go to the
// tensor-core kernels over a BF16 shadow of exactly the blocks their keys lie in (attention/fp8_shadow.cu), and no
// longer to the generic kernel (docs/long-context.md). Prefill-only batches: the decode split heuristic asks the
// device for its multiprocessors.
#include <gtest/gtest.h>

#ifdef BEAMLINE_HAVE_CUDA
#include <numeric>
#include <vector>

#include "backend/cuda/attention/attention.h"

namespace beamline::cuda {
namespace {

struct Batch {
  std::vector<int32_t> query_start{0}, positions, seq_lens;
  void add(int32_t cached, int32_t added) {
    for (int32_t i = 0; i < added; ++i) positions.push_back(cached + i);
    query_start.push_back(query_start.back() + added);
    seq_lens.push_back(cached + added);
  }
  AttentionHostBatch host() const {
    return {query_start.data(), positions.data(), seq_lens.data(), static_cast<int32_t>(seq_lens.size()),
            static_cast<int64_t>(positions.size())};
  }
};

PoolGeometry beam_pool(DType dtype) {
  PoolGeometry pool;
  pool.dtype = dtype;
  pool.num_blocks = 98304;  // --kv-cache-memory 6G of 64 KiB FP8 blocks
  pool.slots_per_block = 2;
  pool.block_size = 16;
  pool.num_kv_heads = 8;
  pool.head_dim = 128;
  return pool;
}

std::vector<ShadowSequence> shadow_parts(const AttentionPlan& plan) {
  std::vector<ShadowSequence> parts;
  const std::size_t begin = 3 * static_cast<std::size_t>(plan.prefill_tiles);
  for (std::size_t i = begin; i < plan.work.size(); i += kShadowFields)
    parts.push_back({plan.work[i], plan.work[i + 1], plan.work[i + 2]});
  return parts;
}

TEST(AttentionPlan, Fp8PrefillAtOneMillionReadsAShadowOfEveryBlock) {
  Batch batch;
  batch.add(1048576 - 16384, 16384);  // the last 16K chunk of a 1M prompt, global layer
  const AttentionPlan plan = plan_attention(batch.host(), beam_pool(DType::F8_E4M3), 48, 0, true, OperandPrecision::Bf16);
  EXPECT_FALSE(plan.generic);
  EXPECT_EQ(plan.decode_rows, 0);
  const AttentionPlan bf16 = plan_attention(batch.host(), beam_pool(DType::BF16), 48, 0, true, OperandPrecision::Bf16);
  EXPECT_EQ(plan.prefill_tiles, bf16.prefill_tiles);  // the BF16 kernels' tiles
  EXPECT_EQ(bf16.shadow_blocks, 0);
  EXPECT_EQ(plan.shadow_blocks, 65536);
  EXPECT_EQ(plan.shadow_sequences, 1);
  const std::vector<ShadowSequence> parts = shadow_parts(plan);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].base, 0);
  EXPECT_EQ(parts[0].first_block, 0);
  EXPECT_EQ(parts[0].blocks, 65536);
}

TEST(AttentionPlan, Fp8PrefillInAWindowShadowsOnlyTheWindowAndTheChunk) {
  Batch batch;
  batch.add(1048576 - 16384, 16384);
  batch.add(0, 100);  // a second prompt's first chunk
  const AttentionPlan plan = plan_attention(batch.host(), beam_pool(DType::F8_E4M3), 48, 512, true, OperandPrecision::Split);
  const std::vector<ShadowSequence> parts = shadow_parts(plan);
  ASSERT_EQ(parts.size(), 2u);
  // Keys from position 1032192 - 511 (the first query's window) to 1048575.
  EXPECT_EQ(parts[0].base, 0);
  EXPECT_EQ(parts[0].first_block, (1048576 - 16384 - 511) / 16);
  EXPECT_EQ(parts[0].blocks, 1048575 / 16 - (1048576 - 16384 - 511) / 16 + 1);
  EXPECT_EQ(parts[1].base, parts[0].blocks);
  EXPECT_EQ(parts[1].first_block, 0);
  EXPECT_EQ(parts[1].blocks, 7);  // 100 keys in blocks of 16
  EXPECT_EQ(plan.shadow_blocks, parts[0].blocks + parts[1].blocks);
}

TEST(AttentionPlan, OtherHeadSizesStayGeneric) {
  Batch batch;
  batch.add(100, 50);
  PoolGeometry pool = beam_pool(DType::F8_E4M3);
  pool.head_dim = 64;
  const AttentionPlan plan = plan_attention(batch.host(), pool, 16, 0, true, OperandPrecision::Bf16);
  EXPECT_TRUE(plan.generic);
  EXPECT_EQ(plan.shadow_blocks, 0);
}

}  // namespace
}  // namespace beamline::cuda
#else
TEST(AttentionPlan, NeedsTheCudaBackend) { GTEST_SKIP() << "built without BEAMLINE_CUDA"; }
#endif
