#pragma once
// The engine's state and one step of its loop, single-threaded: Engine runs it on its own thread, tests
// drive it step by step. A step = schedule, launch it on the model runner with each row's sampling settings, take its
// tokens, check stops, push events to the streams. The runner does the device work; the engine sees token ids only.
// With --async-scheduling (vLLM's overlapped scheduling) a step whose tokens were sampled on the device does not wait
// for them before the next one is scheduled: each producing sequence gets a placeholder token, the next step is
// scheduled and launched with those rows reading the sampled ids on the device (ForwardBatch::deferred_tokens), and
// only then does the host wait for the tokens and check stops, while the device runs the next step. A sequence that
// stopped meanwhile has its extra row dropped. Its outputs equal those of the synchronous loop.
// With --speculative-config each decoding sequence gets draft tokens before the step is scheduled (the n-gram proposer,
// spec/ngram_proposer.h, or the runner's block drafter, spec/block_drafter.h); they join the step as extra query rows with logit rows, and the target's rows decide how
// many are kept (spec/draft_verification.h): the outputs are distributed as without speculation, token for token for
// greedy rows. A draft is proposed from tokens the host has, so speculating engines run synchronously.
// Jump-forward (--jump-forward, structured outputs): where a constrained sequence's grammar forces the next bytes, their
// tokens (GrammarMatcher::jump_forward_tokens) are its draft instead, verified the same way under the grammar's masks,
// so the outputs are exactly those without it while a step can emit several tokens. Where a draft costs the whole batch (the
// runner replays decode graphs, which a step with drafts of different lengths cannot; or --async-scheduling, whose
// next step cannot be launched ahead of the tokens a draft follows) forced tokens are drafted only when every one of
// the step's decoding sequences is inside forced bytes (jump_forward_pays); then, with --async-scheduling, the
// engine waits for the step's tokens so that the next step can carry the drafts.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_stats.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/request_output.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/stop_checker.h"
#include "kv/kv_cache_manager.h"
#include "engine/step_phases.h"
#include "spec/adaptive_verification.h"
#include "structured/token_mask.h"

namespace beamline {

class EngineCore {
 public:
  // `config` must be resolved (max_model_len and block_size filled in, see resolve_engine_config).
  EngineCore(const EngineConfig& config, ModelRunner& runner, const Tokenizer* tokenizer,
             std::vector<TokenId> eos_token_ids);
  ~EngineCore();

  // The request must have passed validate_request; its id must not be in flight.
  void add_request(GenerationRequest request, std::shared_ptr<OutputStream> stream);
  void abort_request(const std::string& request_id);
  std::vector<std::string> abort_all();  // returns the ids that ended
  bool has_work() const { return scheduler_.has_work() || in_flight_ != nullptr; }
  // Some request it holds (running, waiting or preempted) uses this LoRA adapter slot (GenerationRequest::lora_slot).
  bool uses_lora_slot(int32_t slot) const;
  // One step; returns the ids of the requests that ended in it.
  std::vector<std::string> step();
  // Finishes the step launched ahead (--async-scheduling), launching none: afterwards no step is in flight and the
  // runner may change (new weights). Returns the ids of the requests that ended in it.
  std::vector<std::string> settle();
  // Nothing cached is reused afterwards (after new weights, the cached KV is of the old ones).
  void reset_prefix_cache() { kv_.reset_prefix_cache(); }
  // Every running sequence is computed again from its first token (between steps; the KV pool's contents are gone).
  void preempt_all() { scheduler_.preempt_all(); }

  EngineStats stats() const;
  const kv::KvCacheManager& kv() const { return kv_; }
  const Scheduler& scheduler() const { return scheduler_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct RequestState;
  struct SampleState {
    RequestState* request = nullptr;
    int32_t index = 0;
    Sequence sequence;
    SamplerState sampler;
    StopChecker stop;
    bool finished = false;
    bool token_pending = false;  // sequence.tokens ends with the placeholder of a token still being sampled
    bool forced_draft = false;   // the sequence's draft is jump-forward's (counted apart from speculative decoding)
    // Structured outputs: where the output is in the request's grammar. Its next-token mask needs every token so
    // far, so a constrained row is sampled only once the token before it is known (see sample_waiting_rows).
    std::unique_ptr<GrammarMatcher> grammar;
    // Routing replay: the expert ids of every position computed so far ([positions, moe_layers, top_k]), by
    // position, so that a preempted sequence's recomputation rewrites the same rows; the first `routed_ids_sent` ids
    // went out with earlier tokens.
    std::vector<int16_t> routed_experts;
    std::size_t routed_ids_sent = 0;
    // The drafter's confidence in each draft token the sequence holds (adaptive verification learns from them).
    std::vector<float> draft_confidence;
    // prompt_logprobs: entry p + 1 from position p's logits, filled as the prompt is computed; sent with the first token.
    std::vector<std::optional<TokenLogprob>> prompt_logprobs;
    Clock::time_point last_token_time;
    SampleState(RequestState* owner, int32_t sample_index, Sequence seq, uint64_t seed, const Tokenizer* tokenizer,
                std::span<const TokenId> eos, int32_t max_tokens);
  };
  struct RequestState {
    GenerationRequest request;
    std::shared_ptr<OutputStream> stream;
    int32_t max_tokens = 0;
    Clock::time_point arrival;
    std::optional<Clock::time_point> first_scheduled, first_token;
    std::vector<std::unique_ptr<SampleState>> samples;
    int32_t num_finished = 0;
    int64_t saved_bytes = 0;  // hybrid KV savings of finished samples, at their end
    RequestOutput pending;    // this step's event, pushed at the end of the step
    bool has_pending = false;
  };

  // A producing row of a step, as handed to ModelStep::sample.
  struct SampledRow {
    std::size_t producing = 0;  // which of the step's producing rows
    bool on_host = false;       // sampled by engine/sampler.h's sample_token, which records the token itself
  };
  // A step whose forward pass the runner has enqueued and whose tokens the host has not taken yet.
  struct InFlightStep {
    StepPlan plan;
    std::vector<kv::SeqId> ids;  // of plan.scheduled, whose Sequence may end (and go) before the step is finished
    std::vector<std::size_t> producing;  // entries of plan.scheduled with a logit row, in logit order
    std::unique_ptr<ModelStep> model;
    std::vector<SampledRow> sampled;     // in the order of model->sample's rows; empty until they are sampled
    // Every producing row was sampled on the device at launch (the next step may read the tokens there).
    bool sampled_at_launch = false;
  };

  // With speculative decoding: appends a draft to every decoding sequence that may speculate (n-gram lookup, or one
  // pass of the runner's block drafter over all of them); with adaptive verification only the drafts that pay, and
  // none when the step is better off without (then no drafter pass runs); with jump-forward, a constrained sequence's
  // forced tokens instead. Returns whether speculative drafts were proposed (forced tokens do not count).
  bool propose_drafts();
  // A speculating engine schedules a step ahead of the previous one's tokens (--async-scheduling) only when adaptive
  // verification has it run plain: drafts need the tokens. Asked after `step` was launched, for the step after it; a
  // "draft" answer stands for that step (propose_drafts does not ask again).
  bool next_step_plain(const InFlightStep& step);
  // A step by its decoding sequences (one token, or one and its draft) and their drafts, and whether it also carries
  // prompt rows (a chunk, or a preempted sequence's recomputation: the step runs op by op on a runner with decode
  // graphs); adaptive verification's cost tables take the wall time of such a step from `started` to now.
  struct DecodeShape {
    int32_t decoding = 0, draft_tokens = 0;
    bool prompt_rows = false;
  };
  static DecodeShape decode_shape(const InFlightStep& step);
  void record_step_cost(const DecodeShape& shape, bool drafted, Clock::time_point started);
  // With jump-forward and async scheduling: should the engine wait for `step`'s tokens before the next step, so that
  // a constrained sequence inside forced bytes gets its draft? (Its matcher is before the step's token.)
  bool jump_forward_ahead(const InFlightStep& step) const;
  // Whether `forced` of a step's `decoding` sequences should get their forced tokens as drafts (false when none), by
  // what a draft costs the rest of the batch.
  bool jump_forward_pays(std::size_t forced, int32_t decoding) const;
  bool can_jump_forward(const SampleState& sample) const;
  // With a block drafter, right after `step` is launched: has the runner keep the target's hidden states of every row
  // of it as drafter context (its host work then overlaps the step's forward pass on the device: after the step's
  // tokens it was ~0.4-0.8 ms of host time per drafted step with the device idle, bench/results/2026-12-03-spec15.md);
  // once the step is settled, truncate_draft_context drops the rejected drafts' positions.
  void commit_draft_context(const InFlightStep& step);
  void truncate_draft_context(const InFlightStep& step);
  // The rows of a producing sequence with `num_drafts` draft tokens (logit rows from `logit_row`): the target's
  // settings for each, and for sampled (not greedy) rows before the last the draft's verification rule on the host.
  void add_draft_rows(SampleState& sample, int32_t logit_row, int32_t num_drafts, std::vector<RowSampling>& rows);
  // The target's rows of a step's draft decide its fate: keeps the longest confirmed prefix in the sequence and the KV
  // cache (Scheduler::settle_drafts) and returns the tokens to emit: the accepted drafts, then the target's token at the
  // first row that disagreed or after the last draft. Takes the accepted tokens back off the sequence for emit().
  std::vector<SampledToken> settle_drafts(SampleState& sample, int32_t num_drafts, std::vector<SampledToken> rows);
  // prompt_logprobs: scores the step's prompt rows (ScheduledSequence::prompt_logit_index) on the host in
  // --logprobs-mode, into their samples' prompt_logprobs.
  void record_prompt_logprobs(InFlightStep& step);
  // Routing replay: keeps the expert ids of the sample's rows of the step (batch slice `slice`) at their positions.
  static void record_routed_experts(SampleState& sample, const RoutedExperts& routed, const SequenceSlice& slice);
  // Appends one sampled token to the sample, checks stops and adds it to the request's event; true when it ended.
  bool emit(SampleState& sample, SampledToken sampled, Clock::time_point now);
  // Launches the step's forward pass (and its sampling when no row needs the host); null after failing its requests.
  std::unique_ptr<InFlightStep> launch(StepPlan plan, std::vector<std::string>& ended);
  // With --async-scheduling: the step after `current`, scheduled and launched before `current`'s tokens are read.
  std::unique_ptr<InFlightStep> launch_ahead(const InFlightStep& current, std::vector<std::string>& ended);
  // Waits for the step's tokens and hands them to its sequences (stops, streams); skips sequences that ended.
  void finish(InFlightStep& step, std::vector<std::string>& ended);
  // scheduler_.complete of the step's sequences that are still there.
  void complete(const InFlightStep& step);
  void fail_step(const InFlightStep& step, const std::string& what, std::vector<std::string>& ended);
  SampleState* live_sample(kv::SeqId id) const;

  // Hands the step's producing rows `which` to its ModelStep::sample: the settings of each, and for rows that need
  // logit bias, penalties or masked tokens the host path (engine/sampler.h) instead.
  void sample_rows(InFlightStep& step, const std::vector<std::size_t>& which);
  // The rows of each producing sequence of the step (the live ones sampled now unless they were at launch): one
  // token, or with a draft one per logit row.
  std::vector<std::vector<SampledToken>> sample_tokens(InFlightStep& step);
  bool needs_host(const SampleState& sample) const;
  // Some constrained row of the step cannot have its mask yet: its sequence's previous token is still being sampled.
  bool waits_for_grammar(const InFlightStep& step) const;
  // Structured outputs: the allowed-token mask of each constrained row sample_rows just appended to step.sampled (a
  // draft's rows: the grammar advanced through the draft tokens before each).
  void fill_grammar_masks(const InFlightStep& step, std::vector<RowSampling>& rows);
  // --async-scheduling: once `current`'s tokens are in, samples the rows of the step launched ahead that waited only
  // for them (constrained rows), so that the step after it can again be launched ahead. False when some row needs the
  // host path (those rows are sampled when the step finishes).
  bool sample_waiting_rows(InFlightStep& step, std::vector<std::string>& ended);
  // Appends the token to the sample's grammar; false (after failing the request) when the grammar does not allow it.
  bool advance_grammar(SampleState& sample, TokenId token);
  void finish_sample(SampleState& sample, FinishReason reason);
  void fail_request(RequestState& request, const std::string& message);
  // Pushes the request's pending event; when every sample is done, closes the stream and forgets the request.
  void flush(RequestState& request, std::vector<std::string>& ended);
  SampleOutput& pending_sample(SampleState& sample);
  Usage usage_of(const RequestState& request) const;
  int64_t saved_bytes(const Sequence& sequence) const;

  EngineConfig config_;
  ModelRunner& runner_;
  const Tokenizer* tokenizer_;
  std::vector<TokenId> eos_token_ids_;
  int64_t bytes_per_layer_token_;
  kv::KvCacheManager kv_;
  Scheduler scheduler_;
  std::mt19937_64 seeds_;
  kv::SeqId next_sequence_id_ = 0;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<kv::SeqId, SampleState*> samples_by_sequence_;
  EngineStats counters_;
  std::unique_ptr<InFlightStep> in_flight_;  // --async-scheduling: launched in the previous step() call
  std::unique_ptr<StepPhases> phases_ = StepPhases::from_environment();  // BEAMLINE_STEP_PHASES=1
  void mark(StepPhases::Phase phase) {
    if (phases_) phases_->mark(phase);
  }
  std::unique_ptr<AdaptiveVerification> adaptive_;
  bool draft_decided_ = false;  // next_step_plain said the coming step drafts  // --speculative-config with adaptive_verification
};

// Fills in max_model_len and block_size from the runner and checks them against it and against the pool:
// one sequence of max_model_len tokens must fit. An unset max_model_len becomes the model's context, cut
// to what the pool holds (with a warning). Throws Error naming the flag to change.
EngineConfig resolve_engine_config(const EngineConfig& config, const ModelRunner& runner);

}  // namespace beamline
