#include "engine/scheduler.h"

#include <algorithm>

#include "util/error.h"

namespace beamline {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv) : config_(config), kv_(kv) {
  require(config.max_num_seqs >= 1 && config.max_num_batched_tokens >= config.max_num_seqs,
          "scheduler: max_num_batched_tokens ({}) must be at least max_num_seqs ({}) >= 1",
          config.max_num_batched_tokens, config.max_num_seqs);
}

void Scheduler::add(Sequence* sequence) {
  require(sequence->num_tokens() > 0, "scheduler: sequence {} has no tokens", sequence->id);
  waiting_.push_back(sequence);
}

void Scheduler::remove(Sequence* sequence) {
  std::erase(running_, sequence);
  std::erase(waiting_, sequence);
  kv_.free(sequence->id);
}

void Scheduler::drop_drafts(Sequence& sequence, int32_t count) {
  count = std::clamp(count, 0, sequence.num_draft_tokens);
  sequence.tokens.resize(sequence.tokens.size() - count);
  sequence.num_draft_tokens -= count;
}

void Scheduler::preempt(Sequence* victim, StepPlan& plan, int32_t& budget) {
  auto scheduled = std::find_if(plan.scheduled.begin(), plan.scheduled.end(),
                                [&](const ScheduledSequence& s) { return s.sequence == victim; });
  if (scheduled != plan.scheduled.end()) {
    budget += scheduled->num_new_tokens;
    plan.scheduled.erase(scheduled);
  }
  std::erase(running_, victim);
  kv_.free(victim->id);
  drop_drafts(*victim, victim->num_draft_tokens);
  victim->num_computed_tokens = 0;
  ++victim->num_preemptions;
  ++num_preemptions_;
  // Victims go newest first, so pushing each to the front keeps the queue in arrival order.
  waiting_.push_front(victim);
  plan.preempted.push_back(victim);
}

void Scheduler::preempt_all() {
  StepPlan none;
  int32_t budget = 0;
  while (!running_.empty()) preempt(running_.back(), none, budget);
}

bool Scheduler::admissible(const Sequence& sequence) const {
  return sequence.prompt_leader == nullptr || sequence.prompt_leader->prompt_computed;
}

// A sequence with more than one token to compute besides its drafts is mid-prefill (or recomputing after a
// preemption); one with exactly one decodes.
namespace {
int32_t tokens_to_compute(const Sequence& sequence) {
  return sequence.num_tokens() - sequence.num_computed_tokens - sequence.num_draft_tokens;
}
}  // namespace

bool Scheduler::holds_prompts() const {
  if (held_steps_ >= config_.max_prompt_hold_steps || waiting_.empty()) return false;
  // Only a step that would otherwise replay a graph: every running sequence decodes, none computes a prompt chunk.
  // (Between a step and its tokens, as the engine asks about the step after, a decoding sequence has none left.)
  if (std::any_of(running_.begin(), running_.end(), [](const Sequence* s) { return tokens_to_compute(*s) > 1; }))
    return false;
  const int32_t admittable = std::min(num_waiting(), config_.max_num_seqs - num_running());
  return admittable > 0 && 4 * admittable < num_running();
}

bool Scheduler::next_step_has_prompt_rows() const {
  if (std::any_of(running_.begin(), running_.end(), [](const Sequence* s) { return tokens_to_compute(*s) > 1; }))
    return true;
  return !waiting_.empty() && num_running() < config_.max_num_seqs && admissible(*waiting_.front()) && !holds_prompts();
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  const bool hold = holds_prompts();

  // Decoding sequences first, then prefill chunks of running ones, each pass in arrival order.
  for (const bool decode_pass : {true, false}) {
    for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* sequence = running_[i];
      const int32_t remaining = sequence->num_tokens() - sequence->num_computed_tokens;
      if ((remaining - sequence->num_draft_tokens == 1) != decode_pass || remaining <= 0) continue;
      // Drafts are verified whole with their sequence's last token, so those the budget has no room for go.
      drop_drafts(*sequence, remaining - budget);
      int32_t num_new = std::min(sequence->num_tokens() - sequence->num_computed_tokens, budget);
      bool preempted_self = false;
      while (!kv_.allocate(sequence->id, sequence->token_span(), sequence->cache_salt, sequence->num_computed_tokens,
                           num_new)) {
        if (sequence->num_draft_tokens > 0) {  // drafts never cost a preemption
          num_new -= sequence->num_draft_tokens;
          drop_drafts(*sequence, sequence->num_draft_tokens);
          continue;
        }
        Sequence* victim = running_.back();
        preempt(victim, plan, budget);
        if (victim == sequence) {
          preempted_self = true;
          break;
        }
      }
      if (preempted_self) break;  // every later arrival is already preempted
      plan.scheduled.push_back({sequence, num_new, -1});
      budget -= num_new;
    }
  }

  if (hold) ++held_steps_;
  if (plan.preempted.empty() && !hold) {
    while (!waiting_.empty() && budget > 0 && num_running() < config_.max_num_seqs) {
      Sequence* sequence = waiting_.front();
      if (!admissible(*sequence)) break;
      const kv::PrefixHit hit =
          sequence->skip_prefix_cache
              ? kv::PrefixHit{}
              : kv_.find_cached_prefix(sequence->token_span(), sequence->cache_salt, /*count_in_stats=*/!sequence->admitted,
                                       config_.min_computed_tokens);
      const int32_t num_new = std::min(sequence->num_tokens() - hit.num_tokens, budget);
      if (!kv_.allocate(sequence->id, sequence->token_span(), sequence->cache_salt, hit.num_tokens, num_new,
                        sequence->skip_prefix_cache ? nullptr : &hit)) {
        break;
      }
      if (!sequence->admitted) {
        sequence->admitted = true;
        sequence->num_cached_tokens = std::min(hit.num_tokens, sequence->num_prompt_tokens);
      }
      sequence->num_computed_tokens = hit.num_tokens;
      waiting_.pop_front();
      running_.push_back(sequence);
      plan.scheduled.push_back({sequence, num_new, -1});
      budget -= num_new;
    }
    // Prompts left waiting for the budget or blocks (not for slots) are not held again: they enter as soon as they
    // fit. Those left for slots wait for sequences to end, and are held like new arrivals as slots free up.
    held_steps_ = waiting_.empty() || num_running() >= config_.max_num_seqs ? 0 : config_.max_prompt_hold_steps;
  }
  // Drafts live for one step: a running sequence left out of this one loses them.
  for (Sequence* sequence : running_) {
    const bool scheduled = std::any_of(plan.scheduled.begin(), plan.scheduled.end(),
                                       [&](const ScheduledSequence& s) { return s.sequence == sequence; });
    if (!scheduled) drop_drafts(*sequence, sequence->num_draft_tokens);
  }
  build_batch(plan);
  return plan;
}

void Scheduler::build_batch(StepPlan& plan) const {
  ForwardBatch& batch = plan.batch;
  batch.sequences.reserve(plan.scheduled.size());
  for (ScheduledSequence& scheduled : plan.scheduled) {
    const Sequence& sequence = *scheduled.sequence;
    SequenceSlice slice;
    slice.token_begin = static_cast<int32_t>(batch.tokens.size());
    const auto first = sequence.tokens.begin() + sequence.num_computed_tokens;
    batch.tokens.insert(batch.tokens.end(), first, first + scheduled.num_new_tokens);
    slice.token_end = static_cast<int32_t>(batch.tokens.size());
    slice.context_begin = sequence.num_computed_tokens;
    slice.block_tables = kv_.block_tables(sequence.id);
    slice.lora_slot = sequence.lora_slot;
    batch.sequences.push_back(std::move(slice));
    if (sequence.num_computed_tokens + scheduled.num_new_tokens == sequence.num_tokens()) {
      // The last real token's row and one per draft token: row j predicts the token after draft j - 1.
      scheduled.logit_index = static_cast<int32_t>(batch.logit_rows.size());
      scheduled.num_draft_tokens = sequence.num_draft_tokens;
      for (int32_t row = slice.token_end - 1 - sequence.num_draft_tokens; row < slice.token_end; ++row)
        batch.logit_rows.push_back(row);
    }
  }
  for (std::size_t i = 0; i < plan.scheduled.size(); ++i) {
    ScheduledSequence& scheduled = plan.scheduled[i];
    const Sequence& sequence = *scheduled.sequence;
    if (!sequence.prompt_logprobs || sequence.prompt_computed) continue;
    const SequenceSlice& slice = batch.sequences[i];
    // Position p's row predicts prompt token p + 1; the last prompt position's row is the sampling row.
    const int32_t end = std::min(slice.context_begin + scheduled.num_new_tokens, sequence.num_prompt_tokens - 1);
    if (end <= slice.context_begin) continue;
    scheduled.prompt_logit_index = static_cast<int32_t>(batch.logit_rows.size());
    scheduled.num_prompt_logit_rows = end - slice.context_begin;
    for (int32_t row = slice.token_begin; row < slice.token_begin + scheduled.num_prompt_logit_rows; ++row)
      batch.logit_rows.push_back(row);
  }
}

void Scheduler::complete(const StepPlan& plan) {
  for (const ScheduledSequence& scheduled : plan.scheduled) {
    Sequence& sequence = *scheduled.sequence;
    sequence.num_computed_tokens += scheduled.num_new_tokens;
    // Unverified drafts are never published: a rejected one would serve wrong K/V to a later prefix hit.
    kv_.commit(sequence.id, sequence.token_span(), sequence.num_computed_tokens - sequence.num_draft_tokens);
    if (sequence.num_computed_tokens >= sequence.num_prompt_tokens) sequence.prompt_computed = true;
  }
}

void Scheduler::settle_drafts(Sequence& sequence, int32_t num_accepted) {
  require(num_accepted >= 0 && num_accepted <= sequence.num_draft_tokens &&
              sequence.num_computed_tokens == sequence.num_tokens(),
          "scheduler: sequence {} settles {} of {} drafts at {} computed of {} tokens", sequence.id, num_accepted,
          sequence.num_draft_tokens, sequence.num_computed_tokens, sequence.num_tokens());
  drop_drafts(sequence, sequence.num_draft_tokens - num_accepted);
  sequence.num_draft_tokens = 0;
  sequence.num_computed_tokens = sequence.num_tokens();
  kv_.truncate(sequence.id, sequence.num_computed_tokens);
  kv_.commit(sequence.id, sequence.token_span(), sequence.num_computed_tokens);
}

}  // namespace beamline
