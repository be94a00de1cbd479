#pragma once
// Continuous batching over the hybrid paged KV cache (vLLM v1's scheduler design). Each step spends a token
// budget: first one token for every running sequence that is decoding, then prompt chunks of running
// sequences still in prefill, then new sequences from the waiting queue in arrival order (FCFS: the head
// is never skipped, so nothing starves). Prompts longer than what is left of the budget are chunked.
// When the pool runs out of blocks, the most recently arrived running sequence is preempted: its blocks
// are freed (the hashed ones stay in the prefix cache) and it is recomputed when readmitted.
// Speculative decoding: a decoding sequence may carry draft tokens (Sequence::num_draft_tokens). They are scheduled
// with its last real token as extra query rows, each with a logit row, or dropped: trimmed to what the budget holds,
// dropped before the sequence would wait for blocks or preempt another, and dropped when it is left out of the step.
// Their K/V is not published to the prefix cache until settle_drafts keeps the accepted ones.
#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"
#include "model/forward_batch.h"

namespace beamline {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  // A prefix-cache hit leaves at least this many of a sequence's last tokens to compute. A dflash drafter's window:
  // the drafter reads the target's hidden states of the W_d positions before a draft, which a hit skips, so a
  // shorter recomputation would leave the sequence without drafts until it had decoded a window itself.
  int32_t min_computed_tokens = 1;
  // Speculative decoding on a runner that replays decode graphs: a step that carries prompt rows runs op by op (the
  // graphs hold decode and verify rows only), several times a replayed step's host time, so admitting each new prompt
  // into the next step made most steps of a busy batch op by op (bench/results/2026-12-03-spec15.md). While sequences
  // decode and none is mid-prefill, new prompts then wait, for at most this many steps or until they number a quarter
  // of the running sequences, and are admitted together into one step (what does not fit its budget is not held
  // again).
  // 0: admitted at once.
  int32_t max_prompt_hold_steps = 0;
};

struct ScheduledSequence {
  Sequence* sequence = nullptr;
  int32_t num_new_tokens = 0;
  int32_t logit_index = -1;  // row of the step's logits with this sequence's next-token logits; -1 mid-prefill
  int32_t num_draft_tokens = 0;  // draft tokens verified in this step: logit rows logit_index .. + num_draft_tokens
  // Sequence::prompt_logprobs: logit rows prompt_logit_index .. + num_prompt_logit_rows are those of the step's prompt
  // positions from its first (SequenceSlice::context_begin) on, each predicting the prompt token after it. They follow
  // every sampling row of the step.
  int32_t prompt_logit_index = -1;
  int32_t num_prompt_logit_rows = 0;
};

struct StepPlan {
  ForwardBatch batch;
  std::vector<ScheduledSequence> scheduled;  // in batch order
  std::vector<Sequence*> preempted;          // during this step's scheduling
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv);

  void add(Sequence* sequence);     // joins the waiting queue (ids must increase with each call)
  void remove(Sequence* sequence);  // finished or aborted: leaves its queue and frees its blocks
  // Every running sequence gives back its blocks and waits to be computed again (sleep mode drops the KV pool).
  void preempt_all();
  // Chooses the step's work and allocates its blocks. An empty plan means nothing can run now.
  StepPlan schedule();
  // After the forward step: the scheduled tokens are in the cache (their full blocks get published).
  void complete(const StepPlan& plan);
  // After verifying a completed step's drafts: the first `num_accepted` become tokens of the sequence (their K/V is
  // valid and their full blocks get published), the rest leave it and the blocks that held only them go back to the
  // pool. The sequence then ends with its last verified token, computed: the engine appends the next one.
  void settle_drafts(Sequence& sequence, int32_t num_accepted);

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const std::vector<Sequence*>& running() const { return running_; }
  uint64_t num_preemptions() const { return num_preemptions_; }
  // Whether the next schedule() would carry prompt rows (a running sequence mid-prefill, or new prompts it would
  // admit), for what the step will cost: such a step runs op by op. The drafts of decoding sequences are not counted.
  bool next_step_has_prompt_rows() const;

 private:
  void preempt(Sequence* victim, StepPlan& plan, int32_t& budget);
  static void drop_drafts(Sequence& sequence, int32_t count);  // the last `count` drafts
  bool admissible(const Sequence& sequence) const;
  // SchedulerConfig::max_prompt_hold_steps: the next step keeps new prompts waiting.
  bool holds_prompts() const;
  void build_batch(StepPlan& plan) const;

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::vector<Sequence*> running_;  // by id (arrival)
  std::deque<Sequence*> waiting_;   // by id (arrival); preempted sequences come back to the front
  uint64_t num_preemptions_ = 0;
  int32_t held_steps_ = 0;  // steps that kept the waiting prompts waiting (max_prompt_hold_steps: hold no more)
};

}  // namespace beamline
