// Hybrid KV allocation (full groups keep everything, sliding groups only the window), freeing, and prefix
// caching with vLLM's hybrid hit rule, checked against brute-force references.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kv/kv_cache_manager.h"
#include "util/error.h"

namespace beamline::kv {
namespace {

KvCacheLayout make_layout(int32_t block_size, int32_t num_blocks, std::vector<bool> sliding, int32_t slots = 2) {
  KvCacheLayout layout;
  layout.block_size = block_size;
  layout.num_blocks = num_blocks;
  layout.slots_per_block = slots;
  layout.group_is_sliding = sliding;
  for (int32_t g = 0; g < static_cast<int32_t>(sliding.size()); ++g) {
    for (int32_t s = 0; s < slots; ++s) {
      layout.layer_group.push_back(g);
      layout.layer_slot.push_back(s);
    }
  }
  return layout;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab = 50) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Runs a sequence to `length` tokens, `step` tokens per allocation, committing after each.
void run_sequence(KvCacheManager& kv, SeqId id, const std::vector<int32_t>& tokens, int32_t step,
                  const PrefixHit* hit = nullptr, std::string_view salt = "") {
  int32_t computed = hit ? hit->num_tokens : 0;
  bool first = true;
  while (computed < static_cast<int32_t>(tokens.size())) {
    const int32_t n = std::min<int32_t>(step, static_cast<int32_t>(tokens.size()) - computed);
    ASSERT_TRUE(kv.allocate(id, tokens, salt, computed, n, first ? hit : nullptr));
    first = false;
    computed += n;
    kv.commit(id, tokens, computed);
  }
}

TEST(KvCacheManager, SlidingGroupsHoldOnlyTheWindowAndReturnTheRest) {
  const int32_t bs = 4, window = 8;
  KvCacheManager kv(make_layout(bs, 64, {false, true, true}), window, /*prefix caching*/ false);
  std::mt19937 rng(1);
  const auto tokens = random_tokens(rng, 43);
  int32_t computed = 0;
  for (int32_t n : {5, 1, 1, 7, 1, 1, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    ASSERT_TRUE(kv.allocate(7, tokens, "", computed, n));
    const auto& tables = kv.block_tables(7);
    const int32_t end = computed + n;
    const int32_t first_visible = std::max(0, computed - window + 1);
    int32_t held = 0;
    for (int32_t g = 0; g < 3; ++g) {
      ASSERT_EQ(static_cast<int64_t>(tables[g].size()), ceil_div(end, bs)) << "group " << g;
      for (int32_t i = 0; i < static_cast<int32_t>(tables[g].size()); ++i) {
        const bool needed = g == 0 || (i + 1) * bs > first_visible;
        EXPECT_EQ(tables[g][i] != kNullBlock, needed) << "group " << g << " block " << i << " at " << computed;
        held += tables[g][i] != kNullBlock;
      }
    }
    EXPECT_EQ(kv.num_held_blocks(7), held);
    EXPECT_EQ(kv.pool().num_free(), 64 - held) << "blocks that left the window go back to the pool";
    const int64_t every_layer = ceil_div(end, bs) * bs * 6;
    EXPECT_EQ(kv.saved_layer_token_slots(7), every_layer - int64_t{held} * 2 * bs);
    computed = end;
    kv.commit(7, tokens, computed);
  }
  kv.free(7);
  EXPECT_EQ(kv.pool().num_free(), 64);
  EXPECT_FALSE(kv.holds(7));
}

TEST(KvCacheManager, AllocationIsAllOrNothing) {
  KvCacheManager kv(make_layout(4, 5, {false, true}), 4, false);
  std::vector<int32_t> tokens(20, 3);
  ASSERT_TRUE(kv.allocate(1, tokens, "", 0, 8));  // 2 full + 2 sliding blocks
  EXPECT_EQ(kv.pool().num_free(), 1);
  EXPECT_FALSE(kv.allocate(2, tokens, "", 0, 4));  // needs 2, 1 free
  EXPECT_FALSE(kv.holds(2));
  EXPECT_EQ(kv.pool().num_free(), 1);
  // Sequence 1 at 8 computed, 4 new: the sliding group drops block 0 (window 4 sees positions 5..), so 2
  // new blocks fit into 1 free + 1 returned.
  EXPECT_TRUE(kv.allocate(1, tokens, "", 8, 4));
  EXPECT_EQ(kv.pool().num_free(), 0);
  EXPECT_FALSE(kv.allocate(1, tokens, "", 12, 1));
  EXPECT_EQ(kv.block_tables(1)[0].size(), 3u) << "a failed allocation takes nothing";
}

// Speculative decoding's rollback: blocks that hold only rejected positions go back, in every group; a block holding
// verified and rejected positions stays; published blocks cannot be dropped.
TEST(KvCacheManager, TruncateReturnsTheBlocksOfRejectedPositions) {
  KvCacheManager kv(make_layout(4, 16, {false, true}), 8, true);
  std::vector<int32_t> tokens(22, 3);
  ASSERT_TRUE(kv.allocate(1, tokens, "", 0, 9));
  kv.commit(1, tokens, 9);  // blocks 0 and 1 published
  ASSERT_TRUE(kv.allocate(1, tokens, "", 9, 13));  // 4 verified + 9 draft positions: blocks up to 5 in both groups
  EXPECT_EQ(kv.block_tables(1)[0].size(), 6u);
  const int32_t held = kv.num_held_blocks(1);
  EXPECT_EQ(held, 12);
  kv.truncate(1, 13);  // positions 13.. rejected: block 3 keeps 12, blocks 4 and 5 go in both groups
  EXPECT_EQ(kv.block_tables(1)[0].size(), 4u);
  EXPECT_EQ(kv.block_tables(1)[1].size(), 4u);
  EXPECT_EQ(kv.num_held_blocks(1), held - 4);
  EXPECT_EQ(kv.pool().num_free(), 16 - (held - 4));
  kv.commit(1, tokens, 13);
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>(17, 3), "", false).num_tokens, 12) << "blocks 0..2 published";
  // A dflash drafter's window (spec/context_features.h) left to compute: whole blocks before the last 9 tokens.
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>(17, 3), "", false, 9).num_tokens, 8);
  EXPECT_EQ(kv.find_cached_prefix(std::vector<int32_t>(17, 3), "", false, 17).num_tokens, 0);
  EXPECT_THROW(kv.truncate(1, 11), Error) << "block 2 is published";
  kv.free(1);
  EXPECT_EQ(kv.pool().num_free(), 16);
}

TEST(KvCacheManager, PrefixHitReusesBlocksAndNeverTheLastToken) {
  const int32_t bs = 4;
  KvCacheManager kv(make_layout(bs, 64, {false, true}), 8, true);
  std::mt19937 rng(2);
  const auto a = random_tokens(rng, 16);
  run_sequence(kv, 1, a, 16);
  const auto tables_a = kv.block_tables(1);

  // Same 16 tokens: the hit stops a block early (the last token must be computed for logits).
  PrefixHit hit = kv.find_cached_prefix(a, "", true);
  EXPECT_EQ(hit.num_tokens, 12);
  // The same prompt plus one token: all four blocks.
  auto longer = a;
  longer.push_back(5);
  hit = kv.find_cached_prefix(longer, "", true);
  ASSERT_EQ(hit.num_tokens, 16);
  EXPECT_EQ(hit.tables[0], tables_a[0]);
  // Sliding group: only the blocks the next token (position 16) sees: 9..15 -> blocks 2, 3.
  EXPECT_EQ(hit.tables[1][0], kNullBlock);
  EXPECT_EQ(hit.tables[1][1], kNullBlock);
  EXPECT_EQ(hit.tables[1][2], tables_a[1][2]);
  EXPECT_EQ(hit.tables[1][3], tables_a[1][3]);
  EXPECT_EQ(kv.prefix_counters().queries, 33u);
  EXPECT_EQ(kv.prefix_counters().hits, 28u);

  const int32_t free_before = kv.pool().num_free();
  ASSERT_TRUE(kv.allocate(2, longer, "", 16, 1, &hit));
  EXPECT_EQ(kv.pool().num_free(), free_before - 2) << "shared blocks are referenced, not copied";
  EXPECT_EQ(kv.pool().ref_count(tables_a[0][0]), 2);
  // A different salt shares nothing; a different token inside block 1 limits the hit to block 0.
  EXPECT_EQ(kv.find_cached_prefix(longer, "tenant-b", false).num_tokens, 0);
  auto changed = longer;
  changed[5] += 1;
  EXPECT_EQ(kv.find_cached_prefix(changed, "", false).num_tokens, 4);
}

TEST(KvCacheManager, SaltedPrefixesHitOnlyWithTheSameSalt) {
  KvCacheManager kv(make_layout(4, 32, {false}), 0, true);
  std::mt19937 rng(3);
  auto tokens = random_tokens(rng, 13);
  run_sequence(kv, 1, tokens, 13, nullptr, "alice");
  kv.free(1);
  EXPECT_EQ(kv.find_cached_prefix(tokens, "alice", false).num_tokens, 12);
  EXPECT_EQ(kv.find_cached_prefix(tokens, "bob", false).num_tokens, 0);
  EXPECT_EQ(kv.find_cached_prefix(tokens, "", false).num_tokens, 0);
}

TEST(KvCacheManager, SlidingWindowShortensTheFullAttentionHit) {
  // A long sequence prefilled in chunks: its early sliding blocks leave the window (returned, still
  // cached) and are then evicted first, while the full-attention group keeps every block.
  const int32_t bs = 4, window = 8;
  KvCacheManager kv(make_layout(bs, 24, {false, true}), window, true);
  std::mt19937 rng(4);
  const auto a = random_tokens(rng, 40);
  run_sequence(kv, 1, a, 8);  // 10 full blocks + the sliding window's 2-3 blocks
  kv.free(1);
  // Take every plain free block plus six: the oldest cached ones are sliding blocks 0-5 of sequence 1
  // (each filler block index takes one block per group).
  const int32_t plain = kv.pool().num_free() - kv.pool().num_cached_free();
  std::vector<int32_t> filler(bs * ((plain + 7) / 2));
  std::iota(filler.begin(), filler.end(), 1000);
  ASSERT_TRUE(kv.allocate(2, filler, "x", 0, static_cast<int32_t>(filler.size())));
  EXPECT_EQ(kv.pool().num_evictions(), static_cast<uint64_t>(2 * ((plain + 7) / 2) - plain));

  std::vector<BlockHash> hashes;
  extend_block_hashes(hashes, a, bs, "");
  int32_t full_hit = 0;
  while (full_hit < 9 && kv.pool().lookup(BlockKey{hashes[full_hit], 0})) ++full_hit;
  auto prompt = std::vector<int32_t>(a.begin(), a.begin() + 24);
  prompt.push_back(7);
  const PrefixHit hit = kv.find_cached_prefix(prompt, "", false);
  // Brute force: the longest L whose full blocks [0, L) and sliding blocks [L - 2, L) are all cached.
  int32_t expected = 0;
  for (int32_t length = std::min(full_hit, 6); length > 0; --length) {
    bool ok = true;
    for (int32_t i = std::max(0, length - 2); i < length; ++i) ok = ok && kv.pool().lookup(BlockKey{hashes[i], 1});
    if (ok) {
      expected = length;
      break;
    }
  }
  EXPECT_GT(full_hit, expected) << "the test must create a case where the sliding group shortens the hit";
  EXPECT_EQ(hit.num_tokens, expected * bs);
}

// Random workloads on a small pool, then the hit for random prompts against a brute-force reference.
TEST(KvCacheManager, HybridPrefixHitMatchesBruteForce) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t bs = 2 << (rng() % 2);
    const int32_t window = bs * (1 + static_cast<int32_t>(rng() % 3)) + static_cast<int32_t>(rng() % 2);
    std::vector<bool> sliding = {false, true};
    if (rng() % 2) sliding.push_back(true);
    if (rng() % 3 == 0) sliding.erase(sliding.begin());  // sliding groups only
    KvCacheManager kv(make_layout(bs, 40, sliding), window, true);
    const auto base = random_tokens(rng, 60, 3);
    for (int32_t s = 0; s < 12; ++s) {
      std::vector<int32_t> tokens(base.begin(), base.begin() + 4 + rng() % 50);
      for (auto& t : tokens) {
        if (rng() % 25 == 0) t = 3 + static_cast<int32_t>(rng() % 3);
      }
      const PrefixHit hit = kv.find_cached_prefix(tokens, "", false);
      int32_t computed = hit.num_tokens;
      bool ok = kv.allocate(s, tokens, "", computed, 0, &hit);
      while (ok && computed < static_cast<int32_t>(tokens.size())) {
        const int32_t n = std::min<int32_t>(1 + rng() % 9, static_cast<int32_t>(tokens.size()) - computed);
        ok = kv.allocate(s, tokens, "", computed, n);
        if (!ok) break;
        computed += n;
        kv.commit(s, tokens, computed);
      }
      if (rng() % 2 || !ok) kv.free(s);
    }
    for (int q = 0; q < 10; ++q) {
      std::vector<int32_t> prompt(base.begin(), base.begin() + 2 + rng() % 55);
      const PrefixHit hit = kv.find_cached_prefix(prompt, "", false);
      std::vector<BlockHash> hashes;
      extend_block_hashes(hashes, prompt, bs, "");
      const int32_t needed = static_cast<int32_t>(ceil_div(window - 1, bs));
      int32_t expected = 0;
      for (int32_t length = static_cast<int32_t>((prompt.size() - 1) / bs); length > 0 && expected == 0; --length) {
        bool ok = true;
        for (int32_t g = 0; g < static_cast<int32_t>(sliding.size()); ++g) {
          for (int32_t i = sliding[g] ? std::max(0, length - needed) : 0; i < length; ++i) {
            ok = ok && kv.pool().lookup(BlockKey{hashes[i], g});
          }
        }
        if (ok) expected = length;
      }
      ASSERT_EQ(hit.num_tokens, expected * bs) << "trial " << trial;
      for (int32_t g = 0; g < static_cast<int32_t>(sliding.size()); ++g) {
        for (int32_t i = 0; i < expected; ++i) {
          const bool held = !sliding[g] || i >= expected - needed;
          ASSERT_EQ(hit.tables[g][i] != kNullBlock, held);
          if (held) {
            ASSERT_EQ(hit.tables[g][i], *kv.pool().lookup(BlockKey{hashes[i], g}));
          }
        }
      }
    }
  }
}

TEST(KvCacheManager, FreedTailBlocksAreEvictedBeforeTheirPrefix) {
  KvCacheManager kv(make_layout(2, 8, {false}), 0, true);
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  run_sequence(kv, 1, a, 9);  // 5 blocks, 4 full ones cached
  kv.free(1);
  std::vector<int32_t> other(6, 42);
  ASSERT_TRUE(kv.allocate(2, other, "", 0, 6));  // 3 plain free + the 5th plain block... then evictions
  const PrefixHit hit = kv.find_cached_prefix(a, "", false);
  // 8 blocks: 3 were never used, sequence 1's partial block was plain: 4 plain, so 3 taken => no eviction.
  EXPECT_EQ(hit.num_tokens, 8);
  std::vector<int32_t> more(4, 43);
  ASSERT_TRUE(kv.allocate(3, more, "", 0, 4));  // 1 plain + 1 eviction: the tail block goes first
  EXPECT_EQ(kv.find_cached_prefix(a, "", false).num_tokens, 6);
}

TEST(KvCacheManager, BlocksForOneSequenceBoundsWhatItUses) {
  const int32_t bs = 4, window = 12;
  KvCacheManager kv(make_layout(bs, 200, {false, true, true}), window, false);
  std::mt19937 rng(6);
  const auto tokens = random_tokens(rng, 150);
  int32_t computed = 0, peak = 0;
  while (computed < 150) {
    const int32_t n = std::min<int32_t>(1 + rng() % 16, 150 - computed);
    ASSERT_TRUE(kv.allocate(1, tokens, "", computed, n));
    peak = std::max(peak, kv.num_held_blocks(1));
    computed += n;
    kv.commit(1, tokens, computed);
  }
  EXPECT_LE(peak, kv.max_blocks_for_sequence(150, 16));
}

TEST(KvCacheManager, RejectsMisuse) {
  KvCacheManager kv(make_layout(4, 8, {false}), 0, true);
  std::vector<int32_t> tokens(8, 1);
  EXPECT_THROW(kv.allocate(1, tokens, "", 0, 9), Error);
  EXPECT_THROW(kv.allocate(1, tokens, "", 4, 1), Error);  // a new sequence starts at its hit
  EXPECT_THROW(kv.block_tables(99), Error);
  EXPECT_THROW(KvCacheManager(make_layout(4, 8, {true}), 0, true), Error);
}

}  // namespace
}  // namespace beamline::kv
