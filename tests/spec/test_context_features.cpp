// The context-feature ring's bookkeeping: a draft only where the committed run covers its window and ends at the
// anchor; prefix-cache gaps, recomputed stretches and lost slots wait for new features; the pool positions it hands out
// stay in [0, 2R) and agree with t mod R.
#include <gtest/gtest.h>

#include "spec/context_features.h"

namespace beamline {
namespace {

constexpr int32_t kWindow = 16, kBlock = 8;

TEST(ContextFeatureRing, RingHoldsTheWindowAndTheBlock) {
  EXPECT_EQ(ContextFeatureRing(kWindow, kBlock, 4).ring_size(), 32);  // 16 + 8 - 1 = 23, rounded up
  EXPECT_EQ(ContextFeatureRing(64, 16, 4).ring_size(), 128);
  EXPECT_EQ(ContextFeatureRing(9, 8, 4).ring_size(), 16);
}

TEST(ContextFeatureRing, DraftsWhereTheCommittedRunEndsAtTheAnchor) {
  ContextFeatureRing ring(kWindow, kBlock, 4);
  EXPECT_FALSE(ring.begin_draft(1, 5));  // nothing committed
  const auto write = ring.begin_write(1, 0, 40);
  EXPECT_EQ(write.first, 8);  // only the last R = 32 rows are written
  EXPECT_EQ(write.ring.shift, 0);
  EXPECT_FALSE(ring.begin_draft(1, 39));  // the run ends at 40
  EXPECT_FALSE(ring.begin_draft(1, 41));
  const auto draft = ring.begin_draft(1, 40);
  ASSERT_TRUE(draft);
  // Positions 25 .. 47 in use (window back to 40 - 15, block to 47): already in [0, 2R).
  EXPECT_EQ(draft->shift, 0);
  ring.begin_write(1, 40, 41);
  EXPECT_EQ(ring.begin_draft(1, 41)->shift, 0);  // 26 .. 48
  ring.begin_write(1, 41, 60);
  EXPECT_EQ(ring.begin_draft(1, 60)->shift, 32);  // 45 .. 67: 13 .. 35 shifted
  EXPECT_EQ(draft->slot, write.ring.slot);
}

// The engine commits a verify step's rows before its drafts are settled, then truncates the run to what was verified:
// the next draft is at the end of the verified run, its window still covered; with every step rejecting some drafts
// the run keeps covering the window (the rejected positions are never more than B - 1 past it, inside R's slack).
TEST(ContextFeatureRing, ATruncatedRunEndsAtTheVerifiedPositions) {
  ContextFeatureRing ring(kWindow, kBlock, 4);
  ring.begin_write(1, 0, 20);
  ASSERT_TRUE(ring.begin_draft(1, 20));
  ring.begin_write(1, 20, 28);  // the anchor and 7 drafts, of which 2 were accepted
  EXPECT_FALSE(ring.begin_draft(1, 23)) << "the run ends at 28 until it is truncated";
  ring.truncate(1, 23);
  EXPECT_FALSE(ring.begin_draft(1, 28));
  ASSERT_TRUE(ring.begin_draft(1, 23));
  for (int64_t anchor = 23; anchor < 400; anchor += 3) {  // each step: 8 rows written, 3 verified
    ring.begin_write(1, anchor, anchor + kBlock);
    ring.truncate(1, anchor + 3);
    ASSERT_TRUE(ring.begin_draft(1, anchor + 3)) << "anchor " << anchor + 3;
  }
  ring.truncate(1, 1000);  // past the run: nothing changes
  EXPECT_TRUE(ring.begin_draft(1, 401));
  ring.truncate(2, 5);  // an unknown sequence: nothing
  EXPECT_FALSE(ring.begin_draft(2, 5));
}

TEST(ContextFeatureRing, AnchorZeroDraftsWithoutContext) {
  ContextFeatureRing ring(kWindow, kBlock, 2);
  EXPECT_TRUE(ring.begin_draft(7, 0));
}

TEST(ContextFeatureRing, PoolPositionsStayInTwoRings) {
  ContextFeatureRing ring(kWindow, kBlock, 1);
  const int64_t r = ring.ring_size();
  for (int64_t end = 1; end < 500; end += 3) {
    const auto write = ring.begin_write(1, end - 3 < 0 ? 0 : end - 3, end);
    for (int64_t t = write.first; t < end; ++t) {
      EXPECT_GE(t - write.ring.shift, 0);
      EXPECT_LT(t - write.ring.shift, 2 * r);
      EXPECT_EQ((t - write.ring.shift) % r, t % r);
    }
    const auto draft = ring.begin_draft(1, end);
    ASSERT_TRUE(draft) << end;
    for (int64_t t = std::max<int64_t>(0, end - kWindow + 1); t < end + kBlock; ++t) {
      EXPECT_GE(t - draft->shift, 0);
      EXPECT_LT(t - draft->shift, 2 * r);
    }
  }
}

TEST(ContextFeatureRing, APrefixHitWaitsUntilTheWindowIsComputed) {
  ContextFeatureRing ring(kWindow, kBlock, 4);
  ring.begin_write(1, 40, 50);  // positions 0..39 came from the prefix cache: no features
  EXPECT_FALSE(ring.begin_draft(1, 50));
  ring.begin_write(1, 50, 54);
  EXPECT_FALSE(ring.begin_draft(1, 54));  // its window reaches back to 39
  ring.begin_write(1, 54, 55);
  EXPECT_TRUE(ring.begin_draft(1, 55));  // back to 40: the first computed position
}

TEST(ContextFeatureRing, ARecomputedStretchRestartsTheRun) {
  ContextFeatureRing ring(kWindow, kBlock, 4);
  ring.begin_write(1, 0, 100);
  // Preempted and recomputed from the start: its first chunk overwrites ring entries of the old run.
  ring.begin_write(1, 0, 20);
  EXPECT_FALSE(ring.begin_draft(1, 100));
  EXPECT_TRUE(ring.begin_draft(1, 20));
}

TEST(ContextFeatureRing, ADraftedBlockCutsTheRunItOverwrites) {
  ContextFeatureRing ring(kWindow, kBlock, 4);
  ring.begin_write(1, 0, 40);
  ASSERT_TRUE(ring.begin_draft(1, 40));  // the block overwrote entries of positions 8 .. 15
  ring.begin_write(1, 40, 44);           // three drafts accepted and the anchor: 40 .. 43
  EXPECT_TRUE(ring.begin_draft(1, 44));
  // Rewriting rows inside the run (same positions, same values) keeps it.
  ring.begin_write(1, 41, 44);
  EXPECT_TRUE(ring.begin_draft(1, 44));
}

TEST(ContextFeatureRing, TheLeastRecentlyUsedSequenceLosesItsSlot) {
  ContextFeatureRing ring(kWindow, kBlock, 2);
  const int32_t slot1 = ring.begin_write(1, 0, 10).ring.slot;
  const int32_t slot2 = ring.begin_write(2, 0, 10).ring.slot;
  EXPECT_NE(slot1, slot2);
  ASSERT_TRUE(ring.begin_draft(1, 10));  // 1 is now more recent than 2
  EXPECT_EQ(ring.begin_write(3, 0, 10).ring.slot, slot2);
  EXPECT_FALSE(ring.begin_draft(2, 10));
  EXPECT_TRUE(ring.begin_draft(1, 10));
  ring.forget(1);
  EXPECT_FALSE(ring.begin_draft(1, 10));
  EXPECT_EQ(ring.begin_write(4, 0, 10).ring.slot, slot1);
}

}  // namespace
}  // namespace beamline
