// Block pool: reference counts, the plain free list, LRU eviction of cached blocks, against a naive model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "kv/block_pool.h"
#include "util/error.h"

namespace beamline::kv {
namespace {

BlockKey key(uint64_t n, int32_t group = 0) { return BlockKey{BlockHash{n, ~n}, group}; }

TEST(BlockPool, AllocatesAndReleasesWithReferenceCounts) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<BlockId> blocks = pool.allocate(3);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(std::set<BlockId>(blocks.begin(), blocks.end()).size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
  for (BlockId b : blocks) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_THROW(pool.allocate(2), Error);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(blocks[0]);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_THROW(pool.release(blocks[0]), Error);
  EXPECT_THROW(pool.release(17), Error);
}

TEST(BlockPool, CachedBlocksStayFindableUntilEvictedLeastRecentlyReleasedFirst) {
  BlockPool pool(4);
  std::vector<BlockId> blocks = pool.allocate(4);
  for (int i = 0; i < 3; ++i) pool.register_block(blocks[i], key(i));
  for (int i = 0; i < 4; ++i) pool.release(blocks[i]);  // 0, 1, 2 cached in that LRU order; 3 plain
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.num_cached_free(), 3);
  EXPECT_EQ(pool.lookup(key(1)), blocks[1]);

  std::vector<BlockId> first = pool.allocate(1);  // the plain block goes first: no eviction
  EXPECT_EQ(first[0], blocks[3]);
  EXPECT_EQ(pool.num_evictions(), 0u);
  EXPECT_EQ(pool.num_cached(), 3);

  pool.acquire(blocks[0]);  // a prefix hit on the least recent one saves it
  EXPECT_EQ(pool.num_free(), 2);
  std::vector<BlockId> second = pool.allocate(1);
  EXPECT_EQ(second[0], blocks[1]);  // now the least recently released
  EXPECT_FALSE(pool.lookup(key(1)));
  EXPECT_TRUE(pool.lookup(key(0)));
  EXPECT_TRUE(pool.lookup(key(2)));
  EXPECT_EQ(pool.num_evictions(), 1u);
}

TEST(BlockPool, KeysArePerGroupAndTheFirstRegistrationWins) {
  BlockPool pool(3);
  std::vector<BlockId> blocks = pool.allocate(3);
  pool.register_block(blocks[0], key(7, 0));
  pool.register_block(blocks[1], key(7, 0));  // duplicate content: ignored
  pool.register_block(blocks[2], key(7, 1));
  EXPECT_EQ(pool.lookup(key(7, 0)), blocks[0]);
  EXPECT_EQ(pool.lookup(key(7, 1)), blocks[2]);
  pool.release(blocks[1]);
  EXPECT_EQ(pool.num_cached_free(), 0);  // the duplicate went to the plain list
  pool.clear_cache();
  EXPECT_FALSE(pool.lookup(key(7, 0)));
  EXPECT_EQ(pool.num_free(), 1);
}

// Random operations against a naive pool that keeps release timestamps.
TEST(BlockPool, MatchesNaiveModelUnderRandomOperations) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 2 + static_cast<int32_t>(rng() % 30);
    BlockPool pool(n);
    std::vector<int> refs(n, 0);
    std::map<BlockId, uint64_t> key_of;        // cached blocks
    std::map<BlockId, uint64_t> released_at;   // unreferenced cached blocks -> time
    uint64_t clock = 0, next_key = 0;
    for (int op = 0; op < 2000; ++op) {
      const int kind = static_cast<int>(rng() % 4);
      int free_count = 0;
      for (int r : refs) free_count += r == 0;
      ASSERT_EQ(pool.num_free(), free_count);
      if (kind == 0 && free_count > 0) {
        const int32_t count = 1 + static_cast<int32_t>(rng() % free_count);
        int plain = free_count - static_cast<int>(released_at.size());
        // Expected evictions: the (count - plain) least recently released cached blocks.
        std::vector<std::pair<uint64_t, BlockId>> by_time;
        for (auto [b, t] : released_at) by_time.emplace_back(t, b);
        std::sort(by_time.begin(), by_time.end());
        std::set<BlockId> evicted;
        for (int i = 0; i < count - plain; ++i) evicted.insert(by_time[i].second);
        std::vector<BlockId> got = pool.allocate(count);
        for (BlockId b : got) {
          ASSERT_EQ(refs[b], 0);
          refs[b] = 1;
          if (key_of.contains(b)) {
            ASSERT_TRUE(evicted.contains(b)) << "evicted a block that was not among the least recent";
            key_of.erase(b);
            released_at.erase(b);
          }
        }
      } else if (kind == 1) {
        std::vector<BlockId> held;
        for (BlockId b = 0; b < n; ++b) if (refs[b] > 0) held.push_back(b);
        if (held.empty()) continue;
        const BlockId b = held[rng() % held.size()];
        pool.release(b);
        if (--refs[b] == 0 && key_of.contains(b)) released_at[b] = ++clock;
      } else if (kind == 2) {
        std::vector<BlockId> held;
        for (BlockId b = 0; b < n; ++b) if (refs[b] > 0 && !key_of.contains(b)) held.push_back(b);
        if (held.empty()) continue;
        const BlockId b = held[rng() % held.size()];
        key_of[b] = next_key;
        pool.register_block(b, key(next_key++));
      } else if (!key_of.empty()) {
        auto it = key_of.begin();
        std::advance(it, rng() % key_of.size());
        ASSERT_EQ(pool.lookup(key(it->second)), it->first);
        pool.acquire(it->first);
        ++refs[it->first];
        released_at.erase(it->first);
      }
      ASSERT_EQ(pool.num_cached(), static_cast<int32_t>(key_of.size()));
    }
  }
}

}  // namespace
}  // namespace beamline::kv
