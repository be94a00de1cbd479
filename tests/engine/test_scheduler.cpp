// Scheduler: token budget, sequence cap, decode first, chunked prefill, FCFS, preemption without starvation.
// The "model" here is the scheduler's caller: each sequence that reaches its end gets one more token.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>

#include "engine/scheduler.h"
#include "fake_model_runner.h"

namespace beamline {
namespace {

struct Harness {
  kv::KvCacheManager kv;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> sequences;
  std::vector<int32_t> targets;  // total length at which a sequence is done
  int64_t next_id = 0;

  Harness(int32_t num_blocks, int32_t window, SchedulerConfig config, bool caching = true)
      : kv(testing::fake_layout(4, num_blocks, 1, 1), window, caching), scheduler(config, kv) {}

  Sequence* add(int32_t prompt, int32_t output, std::mt19937& rng, const Sequence* leader = nullptr) {
    auto s = std::make_unique<Sequence>();
    s->id = next_id++;
    for (int32_t i = 0; i < prompt; ++i) s->tokens.push_back(static_cast<int32_t>(rng() % 100));
    if (leader) s->tokens = leader->tokens;
    s->num_prompt_tokens = s->num_tokens();
    s->prompt_leader = leader;
    scheduler.add(s.get());
    sequences.push_back(std::move(s));
    targets.push_back(sequences.back()->num_prompt_tokens + output);
    return sequences.back().get();
  }

  // One step; returns the plan after completing it (tokens appended, finished sequences removed).
  StepPlan step() {
    StepPlan plan = scheduler.schedule();
    scheduler.complete(plan);
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.logit_index < 0) continue;
      Sequence& seq = *s.sequence;
      seq.tokens.push_back(static_cast<int32_t>((seq.id * 7 + seq.num_tokens()) % 100));
      if (seq.num_tokens() >= targets[seq.id]) scheduler.remove(&seq);
    }
    return plan;
  }
};

TEST(Scheduler, RespectsBudgetAndSequenceCapAndChunksLongPrompts) {
  std::mt19937 rng(1);
  Harness h(4096, 16, SchedulerConfig{4, 32});
  for (int i = 0; i < 10; ++i) h.add(1 + static_cast<int32_t>(rng() % 70), 1 + static_cast<int32_t>(rng() % 20), rng);
  int steps = 0;
  while (h.scheduler.has_work()) {
    ASSERT_LT(++steps, 2000);
    const StepPlan plan = h.step();
    ASSERT_FALSE(plan.empty());
    EXPECT_LE(static_cast<int32_t>(plan.batch.tokens.size()), 32);
    EXPECT_LE(static_cast<int32_t>(plan.scheduled.size()), 4);
    EXPECT_LE(h.scheduler.num_running(), 4);
    // The batch is consistent: slices tile the tokens, each covers its context and has its tokens.
    int32_t row = 0;
    for (std::size_t i = 0; i < plan.scheduled.size(); ++i) {
      const SequenceSlice& slice = plan.batch.sequences[i];
      EXPECT_EQ(slice.token_begin, row);
      row = slice.token_end;
      EXPECT_EQ(slice.token_end - slice.token_begin, plan.scheduled[i].num_new_tokens);
      const Sequence& seq = *plan.scheduled[i].sequence;
      for (int32_t r = slice.token_begin; r < slice.token_end; ++r) {
        EXPECT_EQ(plan.batch.tokens[r], seq.tokens[slice.context_begin + r - slice.token_begin]);
      }
      for (const auto& table : slice.block_tables) {
        EXPECT_GE(static_cast<int64_t>(table.size()) * 4, slice.context_begin + slice.token_end - slice.token_begin);
      }
    }
    EXPECT_EQ(row, static_cast<int32_t>(plan.batch.tokens.size()));
  }
  for (std::size_t i = 0; i < h.sequences.size(); ++i) EXPECT_EQ(h.sequences[i]->num_tokens(), h.targets[i]);
}

TEST(Scheduler, DecodesGoFirstThenPrefillChunksThenNewArrivalsInOrder) {
  std::mt19937 rng(2);
  Harness h(4096, 16, SchedulerConfig{8, 16});
  Sequence* a = h.add(3, 50, rng);
  Sequence* b = h.add(3, 50, rng);
  h.step();  // both prompts fit: 6 tokens
  ASSERT_EQ(a->num_output_tokens(), 1);
  Sequence* long_prompt = h.add(40, 5, rng);
  Sequence* late = h.add(2, 5, rng);
  const StepPlan plan = h.step();
  ASSERT_EQ(plan.scheduled.size(), 3u);
  EXPECT_EQ(plan.scheduled[0].sequence, a);
  EXPECT_EQ(plan.scheduled[1].sequence, b);
  EXPECT_EQ(plan.scheduled[2].sequence, long_prompt);
  EXPECT_EQ(plan.scheduled[2].num_new_tokens, 14);  // the rest of the budget
  EXPECT_EQ(plan.scheduled[2].logit_index, -1);     // mid-prefill: no logits
  EXPECT_EQ(late->num_computed_tokens, 0) << "FCFS: nothing jumps ahead of the chunked prompt";
  const StepPlan next = h.step();
  EXPECT_EQ(next.scheduled[2].sequence, long_prompt);
  EXPECT_EQ(next.scheduled[2].num_new_tokens, 14);
  EXPECT_EQ(next.batch.sequences[2].context_begin, 14);
}

TEST(Scheduler, PreemptsTheLatestArrivalAndEveryoneFinishes) {
  std::mt19937 rng(3);
  // 24 blocks of 4 tokens, one full + one sliding group (window 8): few sequences fit at once.
  Harness h(24, 8, SchedulerConfig{8, 64});
  for (int i = 0; i < 8; ++i) h.add(6 + static_cast<int32_t>(rng() % 10), 20 + static_cast<int32_t>(rng() % 20), rng);
  std::vector<int32_t> finished_at(8, -1);
  int steps = 0;
  uint64_t seen_preemptions = 0;
  while (h.scheduler.has_work()) {
    ASSERT_LT(++steps, 5000) << "starvation or livelock";
    std::vector<kv::SeqId> running_before;
    for (const Sequence* s : h.scheduler.running()) running_before.push_back(s->id);
    const StepPlan plan = h.step();
    for (const Sequence* victim : plan.preempted) {
      // The victim is the latest arrival among those running before it went.
      for (const ScheduledSequence& s : plan.scheduled) EXPECT_LT(s.sequence->id, victim->id);
      EXPECT_EQ(victim->num_computed_tokens, 0);
      EXPECT_FALSE(h.kv.holds(victim->id));
    }
    seen_preemptions += plan.preempted.size();
    for (std::size_t i = 0; i < h.sequences.size(); ++i) {
      if (finished_at[i] < 0 && h.sequences[i]->num_tokens() >= h.targets[i]) finished_at[i] = steps;
    }
  }
  EXPECT_GT(seen_preemptions, 0u) << "the pool is small enough to force preemption";
  EXPECT_EQ(seen_preemptions, h.scheduler.num_preemptions());
  for (std::size_t i = 0; i < h.sequences.size(); ++i) EXPECT_EQ(h.sequences[i]->num_tokens(), h.targets[i]);
  EXPECT_EQ(h.kv.pool().num_free(), 24) << "every block is back";
}

// Sleep mode drops the KV pool: every running sequence gives its blocks back, waits in arrival order, is computed
// again from its first token, and every sequence still finishes.
TEST(Scheduler, PreemptAllFreesEveryBlockAndEveryoneFinishes) {
  std::mt19937 rng(3);
  Harness h(4096, 16, SchedulerConfig{8, 64}, /*caching=*/false);
  for (int i = 0; i < 5; ++i) h.add(10 + 3 * i, 12, rng);
  for (int i = 0; i < 3; ++i) h.step();
  ASSERT_GT(h.scheduler.num_running(), 1);
  ASSERT_GT(h.kv.usage(), 0.0);
  h.scheduler.preempt_all();
  EXPECT_EQ(h.scheduler.num_running(), 0);
  EXPECT_EQ(h.scheduler.num_waiting(), 5);
  EXPECT_EQ(h.kv.usage(), 0.0);
  for (const auto& sequence : h.sequences) EXPECT_EQ(sequence->num_computed_tokens, 0) << sequence->id;
  const StepPlan first = h.step();
  ASSERT_FALSE(first.scheduled.empty());
  EXPECT_EQ(first.scheduled.front().sequence->id, 0);  // arrival order kept
  int steps = 0;
  while (h.scheduler.has_work()) {
    ASSERT_LT(++steps, 500);
    h.step();
  }
}

TEST(Scheduler, ParallelSamplesWaitForTheLeadersPromptAndShareItsBlocks) {
  std::mt19937 rng(4);
  Harness h(4096, 16, SchedulerConfig{8, 64});
  Sequence* leader = h.add(21, 3, rng);
  Sequence* sibling = h.add(21, 3, rng, leader);
  StepPlan plan = h.step();
  ASSERT_EQ(plan.scheduled.size(), 1u) << "the sibling waits for the leader's prompt";
  plan = h.step();
  ASSERT_EQ(plan.scheduled.size(), 2u);
  EXPECT_EQ(sibling->num_cached_tokens, 20);
  EXPECT_EQ(plan.scheduled[1].num_new_tokens, 1);
  EXPECT_EQ(h.kv.block_tables(sibling->id)[0][0], h.kv.block_tables(leader->id)[0][0]);
}

TEST(Scheduler, PromptLogprobRowsCoverEveryPromptPositionButTheLastOnceAfterTheSamplingRows) {
  std::mt19937 rng(5);
  Harness h(4096, 16, SchedulerConfig{8, 8});
  Sequence* other = h.add(3, 6, rng);
  Sequence* scored = h.add(21, 2, rng);
  scored->prompt_logprobs = true;
  std::vector<int32_t> positions;  // of the prompt rows, as the steps hand them out
  while (h.scheduler.has_work()) {
    StepPlan plan = h.scheduler.schedule();
    for (std::size_t i = 0; i < plan.scheduled.size(); ++i) {
      const ScheduledSequence& s = plan.scheduled[i];
      if (s.sequence != scored) {
        EXPECT_EQ(s.num_prompt_logit_rows, 0);
        continue;
      }
      if (s.num_prompt_logit_rows == 0) continue;
      int32_t sampling_rows = 0;
      for (const ScheduledSequence& t : plan.scheduled) sampling_rows += t.logit_index >= 0 ? 1 : 0;
      EXPECT_GE(s.prompt_logit_index, sampling_rows) << "prompt rows follow the sampling rows";
      const SequenceSlice& slice = plan.batch.sequences[i];
      for (int32_t j = 0; j < s.num_prompt_logit_rows; ++j) {
        const int32_t row = plan.batch.logit_rows[static_cast<std::size_t>(s.prompt_logit_index + j)];
        EXPECT_EQ(row, slice.token_begin + j);
        positions.push_back(slice.context_begin + j);
      }
    }
    h.scheduler.complete(plan);
    for (const ScheduledSequence& s : plan.scheduled) {
      if (s.logit_index < 0) continue;
      Sequence& seq = *s.sequence;
      seq.tokens.push_back(7);
      if (seq.num_tokens() >= h.targets[seq.id]) h.scheduler.remove(&seq);
    }
  }
  std::vector<int32_t> expected(20);
  for (int32_t p = 0; p < 20; ++p) expected[static_cast<std::size_t>(p)] = p;
  EXPECT_EQ(positions, expected);
  EXPECT_EQ(other->num_tokens(), 9);
}

TEST(Scheduler, SequencesThatSkipThePrefixCacheComputeTheirWholePrompt) {
  std::mt19937 rng(6);
  Harness h(4096, 16, SchedulerConfig{8, 64});
  Sequence* first = h.add(21, 1, rng);
  while (h.scheduler.has_work()) h.step();
  Sequence* skipping = h.add(21, 1, rng, first);
  skipping->prompt_leader = nullptr;
  skipping->skip_prefix_cache = true;
  Sequence* reading = h.add(21, 1, rng, first);
  reading->prompt_leader = nullptr;
  const StepPlan plan = h.step();
  ASSERT_EQ(plan.scheduled.size(), 2u);
  EXPECT_EQ(plan.scheduled[0].num_new_tokens, skipping->num_prompt_tokens);
  EXPECT_EQ(skipping->num_cached_tokens, 0);
  EXPECT_GT(reading->num_cached_tokens, 0) << "the same prompt without the flag reads the cache";
}

// SchedulerConfig::max_prompt_hold_steps (speculative decoding on a runner with decode graphs): while sequences
// decode, a new prompt waits (the steps stay prompt-free, so they can replay graphs) for at most that many steps, or
// until the waiting prompts number a quarter of the running sequences; then they enter together. Nothing is held
// while a prompt chunk runs anyway, while nothing decodes, or with the setting off.
TEST(Scheduler, NewPromptsWaitWhileSequencesDecodeThenEnterTogether) {
  auto prompt_rows = [](const StepPlan& plan) {
    return std::any_of(plan.scheduled.begin(), plan.scheduled.end(),
                       [](const ScheduledSequence& s) { return s.num_new_tokens != 1 + s.num_draft_tokens; });
  };
  std::mt19937 rng(7);
  Harness h(4096, 16, SchedulerConfig{16, 256, 1, 3});
  std::vector<Sequence*> running;
  for (int i = 0; i < 8; ++i) running.push_back(h.add(5, 100, rng));
  EXPECT_TRUE(h.scheduler.next_step_has_prompt_rows()) << "nothing decodes yet: the prompts go in at once";
  EXPECT_TRUE(prompt_rows(h.step()));
  EXPECT_FALSE(h.scheduler.next_step_has_prompt_rows());
  EXPECT_FALSE(prompt_rows(h.step()));

  // One arrival among 8 decoding sequences: held for 3 steps, admitted in the 4th.
  Sequence* late = h.add(5, 100, rng);
  for (int held = 0; held < 3; ++held) {
    EXPECT_FALSE(h.scheduler.next_step_has_prompt_rows()) << "step " << held;
    const StepPlan plan = h.step();
    EXPECT_FALSE(prompt_rows(plan)) << "step " << held;
    EXPECT_EQ(plan.scheduled.size(), 8u);
    EXPECT_EQ(late->num_computed_tokens, 0);
  }
  EXPECT_TRUE(h.scheduler.next_step_has_prompt_rows());
  EXPECT_TRUE(prompt_rows(h.step()));
  EXPECT_EQ(late->num_output_tokens(), 1);

  // Three arrivals among 9 running (3 * 4 >= 9): admitted at once, together.
  std::vector<Sequence*> arrivals;
  for (int i = 0; i < 3; ++i) arrivals.push_back(h.add(5, 100, rng));
  EXPECT_TRUE(h.scheduler.next_step_has_prompt_rows());
  const StepPlan together = h.step();
  EXPECT_EQ(together.scheduled.size(), 12u);
  for (const Sequence* arrival : arrivals) EXPECT_EQ(arrival->num_output_tokens(), 1);

  // Admitted together but not all fitting the budget (8 decodes + 2 prompts of 16 in 40 tokens): the third enters the
  // next step, not held again.
  Harness budget(4096, 16, SchedulerConfig{16, 40, 1, 3});
  for (int i = 0; i < 8; ++i) budget.add(1, 100, rng);
  budget.step();
  std::vector<Sequence*> three;
  for (int i = 0; i < 3; ++i) three.push_back(budget.add(16, 100, rng));
  budget.step();
  EXPECT_EQ(three[1]->num_output_tokens(), 1);
  EXPECT_EQ(three[2]->num_computed_tokens, 0) << "the budget ran out";
  EXPECT_TRUE(budget.scheduler.next_step_has_prompt_rows());
  budget.step();
  EXPECT_EQ(three[2]->num_output_tokens(), 1);

  // A prompt chunk in the step anyway (a 60-token prompt in chunks of 16 beside 8 decodes): a new prompt is not held
  // on top of it, but enters as soon as the budget has room.
  Harness chunked(4096, 16, SchedulerConfig{16, 24, 1, 3});
  for (int i = 0; i < 8; ++i) chunked.add(2, 100, rng);
  chunked.step();
  Sequence* long_prompt = chunked.add(60, 5, rng);
  for (int held = 0; held < 3; ++held) chunked.step();
  EXPECT_EQ(long_prompt->num_computed_tokens, 0);
  chunked.step();
  ASSERT_EQ(long_prompt->num_computed_tokens, 16) << "the test wants the prompt mid-prefill";
  Sequence* short_prompt = chunked.add(2, 5, rng);
  EXPECT_TRUE(chunked.scheduler.next_step_has_prompt_rows());
  while (long_prompt->num_computed_tokens < 60) chunked.step();
  EXPECT_GT(short_prompt->num_computed_tokens, 0) << "a prompt waiting behind a chunk is not held on top";

  // Off: admitted at once.
  Harness off(4096, 16, SchedulerConfig{16, 256});
  for (int i = 0; i < 8; ++i) off.add(5, 100, rng);
  off.step();
  Sequence* at_once = off.add(5, 100, rng);
  EXPECT_TRUE(off.scheduler.next_step_has_prompt_rows());
  off.step();
  EXPECT_EQ(at_once->num_output_tokens(), 1);
}

}  // namespace
}  // namespace beamline
