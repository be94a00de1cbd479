#include "engine/prefix_router.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "util/error.h"

namespace beamline {
namespace {

constexpr int32_t kBlock = 4;

std::vector<TokenId> tokens(int32_t first, int32_t count) {
  std::vector<TokenId> ids(count);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

std::vector<TokenId> joined(std::vector<TokenId> head, const std::vector<TokenId>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

TEST(PrefixRouter, ParsesTheFlagAndRefusesOtherNames) {
  EXPECT_EQ(parse_data_parallel_routing("prefix-aware"), DataParallelRouting::PrefixAware);
  EXPECT_EQ(parse_data_parallel_routing("least-loaded"), DataParallelRouting::LeastLoaded);
  try {
    parse_data_parallel_routing("random");
    FAIL() << "accepted 'random'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--data-parallel-routing"), std::string::npos) << error.what();
  }
}

TEST(PrefixRouter, LeastLoadedSearchesFromStartSoTiesGoRound) {
  const std::vector<int64_t> loads{3, 1, 1, 2};
  EXPECT_EQ(least_loaded_engine(loads, 0), 1u);
  EXPECT_EQ(least_loaded_engine(loads, 2), 2u);
  EXPECT_EQ(least_loaded_engine(loads, 3), 1u);
}

TEST(PrefixRouter, LoadBoundAllowsTwoMoreOrHalfAgain) {
  EXPECT_TRUE(within_prefix_load_bound(2, 0));
  EXPECT_FALSE(within_prefix_load_bound(3, 0));
  EXPECT_TRUE(within_prefix_load_bound(15, 10));
  EXPECT_FALSE(within_prefix_load_bound(16, 10));
}

TEST(PrefixRouter, AConversationsNextTurnFollowsItsPrefix) {
  PrefixRouter router(3, kBlock, 100);
  const std::vector<TokenId> first_turn = tokens(1000, 4 * kBlock);
  const std::vector<int64_t> idle{0, 0, 0};
  const std::size_t engine = router.route(first_turn, "", idle, 1);
  EXPECT_EQ(engine, 1u);  // nothing cached anywhere: least loaded from the start
  // The next turn resends the conversation; its engine is busier but within the bound.
  const std::vector<TokenId> second_turn = joined(first_turn, tokens(5000, 3 * kBlock));
  EXPECT_EQ(router.route(second_turn, "", std::vector<int64_t>{0, 2, 0}, 2), 1u);
  // An unrelated prompt goes to the least loaded engine.
  EXPECT_EQ(router.route(tokens(9000, 4 * kBlock), "", std::vector<int64_t>{1, 2, 0}, 0), 2u);
}

TEST(PrefixRouter, TheLoadBoundWinsOverTheCachedPrefix) {
  PrefixRouter router(2, kBlock, 100);
  const std::vector<TokenId> prompt = tokens(1, 3 * kBlock);
  ASSERT_EQ(router.route(prompt, "", std::vector<int64_t>{0, 0}, 0), 0u);
  EXPECT_EQ(router.route(prompt, "", std::vector<int64_t>{3, 0}, 0), 1u);
}

TEST(PrefixRouter, TheLongestMatchedPrefixWins) {
  PrefixRouter router(2, kBlock, 100);
  const std::vector<TokenId> system = tokens(1, 2 * kBlock);
  const std::vector<TokenId> longer = joined(system, tokens(700, 2 * kBlock));
  ASSERT_EQ(router.route(system, "", std::vector<int64_t>{0, 0}, 0), 0u);  // engine 0: 2 blocks
  ASSERT_EQ(router.route(longer, "", std::vector<int64_t>{0, 1}, 1), 0u);  // follows the 2 blocks to engine 0
  // Engine 1 takes a request sharing only the first block (engine 0 is over the load bound).
  const std::vector<TokenId> other = joined(tokens(1, kBlock), tokens(900, 2 * kBlock));
  ASSERT_EQ(router.route(other, "", std::vector<int64_t>{3, 0}, 1), 1u);
  // 4 blocks matched on engine 0 beat 1 on engine 1, even though engine 1 is less loaded.
  EXPECT_EQ(router.route(joined(longer, tokens(1, kBlock)), "", std::vector<int64_t>{1, 0}, 1), 0u);
}

TEST(PrefixRouter, SaltsSeparatePrefixesAndPartialBlocksDoNotCount) {
  PrefixRouter router(2, kBlock, 100);
  const std::vector<TokenId> prompt = tokens(1, 2 * kBlock);
  ASSERT_EQ(router.route(prompt, "tenant-a", std::vector<int64_t>{0, 0}, 0), 0u);
  EXPECT_EQ(router.route(prompt, "tenant-b", std::vector<int64_t>{1, 0}, 0), 1u);
  // Shorter than a block: nothing to match, least loaded.
  EXPECT_EQ(router.route(tokens(1, kBlock - 1), "tenant-a", std::vector<int64_t>{1, 0}, 0), 1u);
}

TEST(PrefixRouter, RemembersABoundedNumberOfBlocksAndForgetsOnClear) {
  PrefixRouter router(2, kBlock, 4);
  const std::vector<TokenId> first = tokens(1, 2 * kBlock);
  ASSERT_EQ(router.route(first, "", std::vector<int64_t>{0, 0}, 0), 0u);
  // Three more blocks on engine 0 push the first prompt's deepest block out, not its first.
  ASSERT_EQ(router.route(tokens(500, 3 * kBlock), "", std::vector<int64_t>{0, 1}, 0), 0u);
  EXPECT_EQ(router.route(first, "", std::vector<int64_t>{1, 0}, 1), 0u);
  router.clear();
  EXPECT_EQ(router.route(first, "", std::vector<int64_t>{1, 0}, 1), 1u);
}

}  // namespace
}  // namespace beamline
