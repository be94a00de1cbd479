#include "engine/engine_core.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <utility>

#include "spec/draft_verification.h"
#include "spec/ngram_proposer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

// How many of `tokens` the grammar takes in a row from where the matcher is (which it is left at).
std::size_t allowed_prefix(GrammarMatcher& matcher, std::span<const TokenId> tokens) {
  std::size_t count = 0;
  while (count < tokens.size() && matcher.accept_token(tokens[count])) ++count;
  matcher.rollback(static_cast<int32_t>(count));
  return count;
}

// A forced run longer than this is drafted over several steps (a long draft costs its rows even where rejected).
constexpr int32_t kMaxJumpForwardTokens = 16;

// A speculating engine on a runner with decode graphs keeps new prompts out of decode steps for at most this many
// steps (SchedulerConfig::max_prompt_hold_steps). With ~1.6 arrivals per drafted step at batch 16, a held prompt
// idles its slot ~1-2 steps of ~2.5 ms while each op-by-op step it avoids costs ~3 ms more than a replayed one: about
// 4 steps balance the two (bench/results/2026-12-03-spec15.md). BEAMLINE_PROMPT_HOLD_STEPS=N sets it (0: off), for
// measuring the rule against admitting at once.
int32_t prompt_hold_steps(const EngineConfig& config, const ModelRunner& runner) {
  constexpr int32_t kPromptHoldSteps = 4;
  if (!config.speculative.enabled() || !runner.replays_decode_graphs()) return 0;
  const char* value = std::getenv("BEAMLINE_PROMPT_HOLD_STEPS");
  return value != nullptr && *value != '\0' ? std::max(0, std::atoi(value)) : kPromptHoldSteps;
}

double seconds_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

EngineConfig resolve_engine_config(const EngineConfig& config, const ModelRunner& runner) {
  config.validate();
  EngineConfig resolved = config;
  const KvCacheLayout& layout = runner.kv_layout();
  require(config.block_size == 0 || config.block_size == layout.block_size,
          "--block-size {} differs from the block size {} the KV cache was built with", config.block_size,
          layout.block_size);
  resolved.block_size = layout.block_size;
  const int64_t model_max = runner.max_position_embeddings();
  const kv::KvCacheManager probe(layout, runner.sliding_window(), false);
  auto fits = [&](int64_t length) {
    return probe.max_blocks_for_sequence(length, resolved.max_num_batched_tokens) <= layout.num_blocks;
  };
  if (resolved.max_model_len == 0) {
    // Unset: the model's context, or the longest sequence the pool can hold when that is less.
    resolved.max_model_len = model_max;
    if (!fits(model_max) && fits(2)) {
      int64_t low = 2, high = model_max;  // fits(low), !fits(high)
      while (high - low > 1) {
        const int64_t middle = low + (high - low) / 2;
        (fits(middle) ? low : high) = middle;
      }
      resolved.max_model_len = low;
      spdlog::warn("max_model_len set to {} (the model allows {}): the KV cache holds no longer sequence; raise "
                   "--kv-cache-memory or --gpu-memory-utilization for more",
                   low, model_max);
    }
  }
  require(resolved.max_model_len <= model_max, "--max-model-len {} exceeds the model's max_position_embeddings {}",
          resolved.max_model_len, model_max);
  require(resolved.max_model_len >= 2, "--max-model-len must be at least 2 (got {})", resolved.max_model_len);
  const int64_t needed = probe.max_blocks_for_sequence(resolved.max_model_len, resolved.max_num_batched_tokens);
  require(needed <= layout.num_blocks,
          "the KV cache ({} blocks of {} tokens) cannot hold one sequence of --max-model-len {} tokens ({} blocks "
          "needed): raise --kv-cache-memory or --gpu-memory-utilization, or lower --max-model-len",
          layout.num_blocks, layout.block_size, resolved.max_model_len, needed);
  return resolved;
}

EngineCore::SampleState::SampleState(RequestState* owner, int32_t sample_index, Sequence seq, uint64_t seed,
                                     const Tokenizer* tokenizer, std::span<const TokenId> eos, int32_t max_tokens)
    : request(owner),
      index(sample_index),
      sequence(std::move(seq)),
      sampler(seed, owner->request.prompt, owner->request.sampling),
      stop(tokenizer, owner->request.detokenize, owner->request.sampling, eos, max_tokens) {
  if (owner->request.grammar) grammar = std::make_unique<GrammarMatcher>(owner->request.grammar);
}

EngineCore::EngineCore(const EngineConfig& config, ModelRunner& runner, const Tokenizer* tokenizer,
                       std::vector<TokenId> eos_token_ids)
    : config_(config),
      runner_(runner),
      tokenizer_(tokenizer),
      eos_token_ids_(std::move(eos_token_ids)),
      bytes_per_layer_token_(runner.kv_bytes_per_block() /
                             (static_cast<int64_t>(runner.kv_layout().slots_per_block) * runner.kv_layout().block_size)),
      kv_(runner.kv_layout(), runner.sliding_window(), config.enable_prefix_caching),
      scheduler_(SchedulerConfig{config.max_num_seqs, config.max_num_batched_tokens,
                                 config.speculative.method == SpeculativeMethod::DFlash
                                     ? std::max(1, runner.drafter_window())
                                     : 1,
                                 prompt_hold_steps(config, runner)},
                 kv_),
      seeds_(config.seed) {
  const SpeculativeConfig& spec = config.speculative;
  if (!spec.enabled()) return;
  require(spec.method == SpeculativeMethod::Ngram || runner_.has_drafter(),
          "--speculative-config: method \"dflash\" needs a model runner with its drafter loaded");
  // Its presence tells /metrics that speculative decoding is on, so the counters show from the start.
  counters_.spec_decode_num_accepted_tokens_per_pos.assign(spec.num_speculative_tokens, 0);
  const std::string proposer = spec.method == SpeculativeMethod::Ngram
                                   ? fmt::format("n-gram drafts (prompt lookup {}..{})", spec.prompt_lookup_min,
                                                 spec.prompt_lookup_max)
                                   : fmt::format("block drafts of the dflash drafter {}", spec.model);
  // With decode graphs, every sequence of a step verifies the same number of drafts, so that the step replays one.
  if (spec.adaptive_verification)
    adaptive_ = std::make_unique<AdaptiveVerification>(spec.num_speculative_tokens, runner_.replays_decode_graphs());
  spdlog::info("speculative decoding: {} of up to {} tokens, verified in the target's step{}; {}", proposer,
               spec.num_speculative_tokens,
               spec.adaptive_verification ? " as far as they pay (adaptive verification)" : "",
               !config.async_scheduling ? "the engine runs synchronously"
               : spec.adaptive_verification
                   ? "steps without drafts are scheduled ahead (--async-scheduling), steps with drafts wait for the tokens"
                   : "the engine runs synchronously (--async-scheduling does not apply: every step may draft)");
  if (const int32_t hold = prompt_hold_steps(config, runner_); hold > 0)
    spdlog::info("speculative decoding with decode graphs: new prompts wait up to {} steps while sequences decode, "
                 "then enter together (BEAMLINE_PROMPT_HOLD_STEPS)", hold);
}

EngineCore::~EngineCore() {
  if (phases_) spdlog::info("{}", phases_->table());
}

int64_t EngineCore::saved_bytes(const Sequence& sequence) const {
  if (!kv_.holds(sequence.id)) return 0;
  return kv_.saved_layer_token_slots(sequence.id) * bytes_per_layer_token_;
}

void EngineCore::add_request(GenerationRequest request, std::shared_ptr<OutputStream> stream) {
  auto state = std::make_unique<RequestState>();
  state->max_tokens = effective_max_tokens(request, config_.max_model_len);
  state->arrival = Clock::now();
  state->stream = std::move(stream);
  state->request = std::move(request);
  const GenerationRequest& r = state->request;
  for (int32_t i = 0; i < r.sampling.n; ++i) {
    Sequence sequence;
    sequence.id = next_sequence_id_++;
    sequence.tokens = r.prompt;
    sequence.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
    // Blocks computed with an adapter hold other K/V than the base model's or another adapter's: the key tells them
    // apart (tagged, so that no client salt can spell another's key).
    sequence.cache_salt = r.lora_id == 0 ? "base:" + r.cache_salt : fmt::format("lora {}:{}", r.lora_id, r.cache_salt);
    sequence.lora_slot = r.lora_slot;
    sequence.prompt_logprobs = r.sampling.prompt_logprobs.has_value();
    sequence.skip_prefix_cache = r.return_routed_experts || sequence.prompt_logprobs;
    if (i > 0 && config_.enable_prefix_caching && !sequence.skip_prefix_cache)
      sequence.prompt_leader = &state->samples.front()->sequence;
    const uint64_t seed = sample_seed(r.sampling.seed, i, seeds_());
    state->samples.push_back(std::make_unique<SampleState>(state.get(), i, std::move(sequence), seed, tokenizer_,
                                                           eos_token_ids_, state->max_tokens));
  }
  for (auto& sample : state->samples) {
    if (sample->sequence.prompt_logprobs) sample->prompt_logprobs.resize(r.prompt.size());
    samples_by_sequence_[sample->sequence.id] = sample.get();
    scheduler_.add(&sample->sequence);
  }
  counters_.prompt_tokens_total += r.prompt.size();
  requests_.emplace(r.request_id, std::move(state));
}

bool EngineCore::uses_lora_slot(int32_t slot) const {
  return std::any_of(requests_.begin(), requests_.end(),
                     [slot](const auto& entry) { return entry.second->request.lora_slot == slot; });
}

SampleOutput& EngineCore::pending_sample(SampleState& sample) {
  RequestState& request = *sample.request;
  if (!request.has_pending) {
    request.pending = RequestOutput{};
    request.pending.request_id = request.request.request_id;
    request.has_pending = true;
  }
  auto& samples = request.pending.samples;
  auto it = std::find_if(samples.begin(), samples.end(), [&](const SampleOutput& s) { return s.index == sample.index; });
  if (it != samples.end()) return *it;
  samples.push_back(SampleOutput{});
  samples.back().index = sample.index;
  return samples.back();
}

void EngineCore::finish_sample(SampleState& sample, FinishReason reason) {
  if (sample.finished) return;
  RequestState& request = *sample.request;
  request.saved_bytes += saved_bytes(sample.sequence);
  counters_.kv_hybrid_saved_bytes_finished_total += static_cast<uint64_t>(std::max<int64_t>(0, saved_bytes(sample.sequence)));
  scheduler_.remove(&sample.sequence);
  samples_by_sequence_.erase(sample.sequence.id);
  runner_.forget_sequence(sample.sequence.id);
  sample.finished = true;
  ++request.num_finished;
  SampleOutput& out = pending_sample(sample);
  if (!out.finish_reason) out.finish_reason = reason;
}

Usage EngineCore::usage_of(const RequestState& request) const {
  Usage usage;
  usage.prompt_tokens = static_cast<int32_t>(request.request.prompt.size());
  for (const auto& sample : request.samples) usage.completion_tokens += sample->sequence.num_output_tokens();
  usage.cached_tokens = request.samples.front()->sequence.num_cached_tokens;
  return usage;
}

void EngineCore::flush(RequestState& request, std::vector<std::string>& ended) {
  if (!request.has_pending) return;
  RequestOutput output = std::move(request.pending);
  request.has_pending = false;
  output.usage = usage_of(request);
  const bool done = request.num_finished == static_cast<int32_t>(request.samples.size());
  if (done) {
    const auto now = Clock::now();
    output.finished = true;
    output.metrics.queue_seconds =
        request.first_scheduled ? seconds_between(request.arrival, *request.first_scheduled) : seconds_between(request.arrival, now);
    output.metrics.time_to_first_token_seconds =
        request.first_token ? seconds_between(request.arrival, *request.first_token) : 0.0;
    output.metrics.e2e_seconds = seconds_between(request.arrival, now);
    for (const auto& sample : request.samples) output.metrics.preemptions += sample->sequence.num_preemptions;
    output.metrics.kv_hybrid_saved_bytes = request.saved_bytes;

    ++counters_.requests_finished_total;
    FinishReason overall = FinishReason::Stop;
    for (const auto& sample_output : output.samples) {
      if (sample_output.finish_reason && *sample_output.finish_reason != FinishReason::Stop) overall = *sample_output.finish_reason;
    }
    if (output.error) overall = FinishReason::Error;
    switch (overall) {
      case FinishReason::Stop: ++counters_.requests_stopped; break;
      case FinishReason::Length: ++counters_.requests_length; break;
      case FinishReason::Abort: ++counters_.requests_aborted; break;
      case FinishReason::Error: ++counters_.requests_failed; break;
    }
    counters_.e2e_request_latency.observe(output.metrics.e2e_seconds);
    counters_.request_queue_time.observe(output.metrics.queue_seconds);
  }
  const std::string id = request.request.request_id;
  request.stream->push(std::move(output));
  if (done) {
    ended.push_back(id);
    requests_.erase(id);
  }
}

void EngineCore::abort_request(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestState& request = *it->second;
  for (auto& sample : request.samples) finish_sample(*sample, FinishReason::Abort);
  std::vector<std::string> ended;
  flush(request, ended);
}

std::vector<std::string> EngineCore::abort_all() {
  std::vector<std::string> ids;
  for (const auto& [id, state] : requests_) ids.push_back(id);
  for (const std::string& id : ids) abort_request(id);
  return ids;
}

std::vector<std::string> EngineCore::settle() {
  std::vector<std::string> ended;
  if (!in_flight_) return ended;
  const std::unique_ptr<InFlightStep> current = std::move(in_flight_);
  finish(*current, ended);
  return ended;
}

void EngineCore::fail_request(RequestState& request, const std::string& message) {
  for (auto& sample : request.samples) finish_sample(*sample, FinishReason::Error);
  request.pending.error = message;
}

std::vector<std::string> EngineCore::step() {
  std::vector<std::string> ended;
  const auto started = Clock::now();
  const uint64_t tokens_before = counters_.generation_tokens_total;
  if (phases_) phases_->begin_step();
  bool drafted = false;
  if (!in_flight_) {
    drafted = propose_drafts();
    mark(StepPhases::Phase::Propose);
    StepPlan plan = scheduler_.schedule();
    mark(StepPhases::Phase::Schedule);
    if (plan.empty()) {
      // Only a sequence the empty pool cannot hold stops everything; resolve_engine_config rules it out, but a
      // hang would be worse than failing the request at the head.
      if (scheduler_.num_running() == 0 && scheduler_.num_waiting() > 0) {
        for (auto& [id, request] : requests_) {
          if (request->first_scheduled) continue;
          fail_request(*request, "the KV cache cannot hold this request");
          flush(*request, ended);
          break;
        }
      }
      return ended;
    }
    in_flight_ = launch(std::move(plan), ended);
    if (!in_flight_) return ended;
    complete(*in_flight_);
    mark(StepPhases::Phase::Launch);
  }
  std::unique_ptr<InFlightStep> next;
  // Drafts come from the host's tokens, so a speculating engine waits for each step's tokens before a drafted step;
  // a plain one (adaptive verification's choice) it launches ahead (its context was committed at its launch).
  if (config_.async_scheduling && in_flight_->sampled_at_launch && !jump_forward_ahead(*in_flight_) &&
      (!config_.speculative.enabled() || next_step_plain(*in_flight_))) {
    next = launch_ahead(*in_flight_, ended);
  }
  mark(StepPhases::Phase::Launch);
  const std::unique_ptr<InFlightStep> current = std::move(in_flight_);
  const bool verifies_drafts = std::any_of(current->plan.scheduled.begin(), current->plan.scheduled.end(),
                                           [](const ScheduledSequence& s) { return s.num_draft_tokens > 0; });
  // Taken before finish(): a sequence that ends in it goes.
  const DecodeShape shape = decode_shape(*current);
  finish(*current, ended);
  if (adaptive_) record_step_cost(shape, drafted, started);
  if (next && !next->sampled_at_launch && !sample_waiting_rows(*next, ended)) next.reset();
  if (next) {
    // Its placeholders now hold the sampled tokens, so the blocks it fills hash what they store.
    complete(*next);
    in_flight_ = std::move(next);
  }
  if (phases_) {
    mark(StepPhases::Phase::Launch);
    phases_->end_step(StepPhases::kind(verifies_drafts, shape.prompt_rows),
                      static_cast<int64_t>(counters_.generation_tokens_total - tokens_before));
  }
  return ended;
}

EngineCore::SampleState* EngineCore::live_sample(kv::SeqId id) const {
  const auto found = samples_by_sequence_.find(id);
  return found == samples_by_sequence_.end() ? nullptr : found->second;
}

bool EngineCore::needs_host(const SampleState& sample) const {
  // Backend::sample reports raw_logprobs only: the other --logprobs-mode values are computed on the host.
  const SamplingParams& params = sample.request->request.sampling;
  if (params.logprobs && config_.logprobs_mode != LogprobsMode::RawLogprobs) return true;
  return needs_host_edits(params, sample.stop.masked_tokens(sample.sequence.num_output_tokens()));
}

bool EngineCore::waits_for_grammar(const InFlightStep& step) const {
  return std::any_of(step.producing.begin(), step.producing.end(), [&](std::size_t i) {
    const SampleState& sample = *samples_by_sequence_.at(step.ids[i]);
    return sample.grammar != nullptr && sample.token_pending;
  });
}

bool EngineCore::sample_waiting_rows(InFlightStep& step, std::vector<std::string>& ended) {
  std::vector<std::size_t> live;
  for (std::size_t p = 0; p < step.producing.size(); ++p) {
    const SampleState* sample = live_sample(step.ids[step.producing[p]]);
    if (sample == nullptr) continue;
    if (needs_host(*sample)) return true;
    live.push_back(p);
  }
  try {
    sample_rows(step, live);
  } catch (const std::exception& error) {
    fail_step(step, error.what(), ended);
    return false;
  }
  step.sampled_at_launch = true;
  return true;
}

bool EngineCore::advance_grammar(SampleState& sample, TokenId token) {
  if (sample.grammar == nullptr || sample.grammar->accept_token(token)) return true;
  // The mask allows only grammar tokens, so this is a row whose every allowed token was masked again (min_tokens
  // holding back the only possible end); failing says so instead of emitting output that does not parse.
  fail_request(*sample.request, fmt::format("structured outputs: token {} at output position {} is not allowed by "
                                            "the grammar (no allowed token was left to sample)",
                                            token, sample.sequence.num_output_tokens()));
  return false;
}

void EngineCore::fail_step(const InFlightStep& step, const std::string& what, std::vector<std::string>& ended) {
  spdlog::error("forward step failed: {}; failing the {} requests in it", what, step.ids.size());
  std::vector<RequestState*> failed;
  for (const kv::SeqId id : step.ids) {
    const SampleState* sample = live_sample(id);
    if (sample != nullptr && std::find(failed.begin(), failed.end(), sample->request) == failed.end())
      failed.push_back(sample->request);
  }
  for (RequestState* request : failed) {
    fail_request(*request, std::string("the model failed: ") + what);
    flush(*request, ended);
  }
}

std::unique_ptr<EngineCore::InFlightStep> EngineCore::launch(StepPlan plan, std::vector<std::string>& ended) {
  auto step = std::make_unique<InFlightStep>();
  step->plan = std::move(plan);
  const auto scheduled_at = Clock::now();
  for (std::size_t i = 0; i < step->plan.scheduled.size(); ++i) {
    const ScheduledSequence& s = step->plan.scheduled[i];
    step->ids.push_back(s.sequence->id);
    if (s.logit_index >= 0) step->producing.push_back(i);
    RequestState& request = *samples_by_sequence_.at(s.sequence->id)->request;
    if (!request.first_scheduled) request.first_scheduled = scheduled_at;
    if (request.request.return_routed_experts) step->plan.batch.capture_routed_experts = true;
  }
  try {
    step->model = runner_.launch(step->plan.batch);
    // A step whose rows all sample on the device is sampled now, so the next step can read its tokens there;
    // rows that need the host are sampled when the step is finished, after the previous tokens are in.
    const bool on_device = std::none_of(step->producing.begin(), step->producing.end(), [&](std::size_t i) {
      const SampleState& sample = *samples_by_sequence_.at(step->ids[i]);
      const bool verifies_on_host = step->plan.scheduled[i].num_draft_tokens > 0 &&
                                    !sample.request->request.sampling.greedy() && !sample.forced_draft;
      return needs_host(sample) || verifies_on_host;
    });
    if (on_device && !step->producing.empty() && !waits_for_grammar(*step)) {
      std::vector<std::size_t> all(step->producing.size());
      std::iota(all.begin(), all.end(), std::size_t{0});
      sample_rows(*step, all);
      step->sampled_at_launch = true;
    }
    mark(StepPhases::Phase::Launch);
    commit_draft_context(*step);
    mark(StepPhases::Phase::Commit);
  } catch (const std::exception& error) {
    fail_step(*step, error.what(), ended);
    return nullptr;
  }
  return step;
}

std::unique_ptr<EngineCore::InFlightStep> EngineCore::launch_ahead(const InFlightStep& current,
                                                                   std::vector<std::string>& ended) {
  // A placeholder for each token `current` is sampling, unless it will be its sequence's last by length.
  std::unordered_map<kv::SeqId, int32_t> source_rows;  // sequence -> its row of current's samples
  for (std::size_t d = 0; d < current.sampled.size(); ++d) {
    const kv::SeqId id = current.ids[current.producing[current.sampled[d].producing]];
    SampleState* sample = live_sample(id);
    if (sample == nullptr || sample->sequence.num_output_tokens() + 1 >= sample->request->max_tokens) continue;
    sample->sequence.tokens.push_back(0);
    sample->token_pending = true;
    source_rows.emplace(id, static_cast<int32_t>(d));
  }
  StepPlan plan = scheduler_.schedule();
  if (plan.empty()) return nullptr;
  for (std::size_t i = 0; i < plan.scheduled.size(); ++i) {
    const ScheduledSequence& s = plan.scheduled[i];
    const auto source = source_rows.find(s.sequence->id);
    if (source == source_rows.end()) continue;
    // The scheduler takes a sequence that has just sampled as a one-token decode of that placeholder; anything else
    // would read a placeholder as a token, so the step's requests fail (with the reason) instead of running it.
    if (s.num_new_tokens != 1 || s.sequence->num_computed_tokens + 1 != s.sequence->num_tokens()) {
      InFlightStep failed;
      for (const ScheduledSequence& scheduled : plan.scheduled) failed.ids.push_back(scheduled.sequence->id);
      fail_step(failed,
                fmt::format("async scheduling: sequence {} was scheduled for {} tokens at {} of {}", s.sequence->id,
                            s.num_new_tokens, s.sequence->num_computed_tokens, s.sequence->num_tokens()),
                ended);
      return nullptr;
    }
    plan.batch.deferred_tokens.push_back({plan.batch.sequences[i].token_begin, source->second});
  }
  return launch(std::move(plan), ended);
}

void EngineCore::complete(const InFlightStep& step) {
  StepPlan live;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i)
    if (live_sample(step.ids[i]) != nullptr) live.scheduled.push_back(step.plan.scheduled[i]);
  scheduler_.complete(live);
}

void EngineCore::finish(InFlightStep& step, std::vector<std::string>& ended) {
  std::vector<std::vector<SampledToken>> sampled_tokens;
  try {
    sampled_tokens = sample_tokens(step);
  } catch (const std::exception& error) {
    fail_step(step, error.what(), ended);
    return;
  }
  mark(StepPhases::Phase::Wait);
  ++counters_.steps_total;
  RoutedExperts routed;
  if (step.plan.batch.capture_routed_experts) {
    try {
      routed = step.model->routed_experts();
      require(routed.row_width() > 0 && routed.ids.size() == step.plan.batch.tokens.size() * routed.row_width(),
              "routed experts: the model runner returned {} ids ({} layers, top-{}) for a step of {} rows",
              routed.ids.size(), routed.num_moe_layers, routed.top_k, step.plan.batch.tokens.size());
    } catch (const std::exception& error) {
      fail_step(step, error.what(), ended);
      return;
    }
  }
  try {
    record_prompt_logprobs(step);
  } catch (const std::exception& error) {
    fail_step(step, error.what(), ended);
    return;
  }

  const auto now = Clock::now();
  std::vector<RequestState*> touched;
  std::size_t next_producing = 0;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i) {
    const bool producing = next_producing < step.producing.size() && step.producing[next_producing] == i;
    const std::size_t p = producing ? next_producing++ : 0;
    SampleState* live = live_sample(step.ids[i]);
    if (live == nullptr) continue;  // ended (aborted, or stopped) while the step ran: its row is dropped
    SampleState& sample = *live;
    RequestState& request = *sample.request;
    if (std::find(touched.begin(), touched.end(), &request) == touched.end()) touched.push_back(&request);
    if (request.request.return_routed_experts)
      record_routed_experts(sample, routed, step.plan.batch.sequences[i]);
    if (!producing) continue;
    std::vector<SampledToken> tokens = std::move(sampled_tokens[p]);
    const int32_t num_drafts = step.plan.scheduled[i].num_draft_tokens;
    if (num_drafts > 0) tokens = settle_drafts(sample, num_drafts, std::move(tokens));
    for (SampledToken& token : tokens) {
      if (emit(sample, std::move(token), now)) break;  // a stop ends the sample: later tokens are dropped
    }
  }
  for (RequestState* request : touched) flush(*request, ended);
  mark(StepPhases::Phase::Emit);
  truncate_draft_context(step);
  mark(StepPhases::Phase::Commit);
}

void EngineCore::record_prompt_logprobs(InFlightStep& step) {
  struct Entry {
    SampleState* sample;
    int32_t position;  // its row predicts prompt token position + 1
  };
  std::vector<Entry> entries;
  std::vector<int32_t> rows;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i) {
    const ScheduledSequence& scheduled = step.plan.scheduled[i];
    SampleState* sample = live_sample(step.ids[i]);
    if (sample == nullptr || scheduled.num_prompt_logit_rows == 0) continue;
    const int32_t first = step.plan.batch.sequences[i].context_begin;
    for (int32_t j = 0; j < scheduled.num_prompt_logit_rows; ++j) {
      entries.push_back({sample, first + j});
      rows.push_back(scheduled.prompt_logit_index + j);
    }
  }
  if (rows.empty()) return;
  const std::vector<float> logits = step.model->raw_logits(rows);
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  // A prompt token is not drawn: no temperature or filter shapes its row, so the processed modes give the raw values.
  ThreadPool::global().parallel_for(entries.size(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t e = begin; e < end; ++e) {
      const Entry& entry = entries[e];
      const std::span<const float> row(logits.data() + e * vocab, vocab);
      SampleRow settings;
      settings.greedy = true;
      settings.num_logprobs = *entry.sample->request->request.sampling.prompt_logprobs;
      const auto next = static_cast<std::size_t>(entry.position) + 1;
      entry.sample->prompt_logprobs[next] =
          logprob_in_mode(row, row, settings, entry.sample->sequence.tokens[next], config_.logprobs_mode);
    }
  });
}

void EngineCore::record_routed_experts(SampleState& sample, const RoutedExperts& routed, const SequenceSlice& slice) {
  const std::size_t width = routed.row_width();
  const auto rows = static_cast<std::size_t>(slice.token_end - slice.token_begin);
  const auto from = static_cast<std::size_t>(slice.token_begin) * width;
  const auto to = static_cast<std::size_t>(slice.context_begin) * width;
  if (sample.routed_experts.size() < to + rows * width) sample.routed_experts.resize(to + rows * width);
  std::copy_n(routed.ids.begin() + static_cast<std::ptrdiff_t>(from), rows * width,
              sample.routed_experts.begin() + static_cast<std::ptrdiff_t>(to));
}

bool EngineCore::emit(SampleState& sample, SampledToken sampled, Clock::time_point now) {
  RequestState& request = *sample.request;
  Sequence& sequence = sample.sequence;
  if (sample.token_pending) {
    sequence.tokens.back() = sampled.token;
    sample.token_pending = false;
  } else {
    sequence.tokens.push_back(sampled.token);
  }
  ++counters_.generation_tokens_total;
  if (!request.first_token) {
    request.first_token = now;
    counters_.time_to_first_token.observe(seconds_between(request.arrival, now));
  } else if (sequence.num_output_tokens() > 1) {
    counters_.inter_token_latency.observe(seconds_between(sample.last_token_time, now));
  }
  sample.last_token_time = now;

  if (!advance_grammar(sample, sampled.token)) return true;
  StopChecker::Result check = sample.stop.push(sampled.token, sequence.num_output_tokens());
  SampleOutput& out = pending_sample(sample);
  out.token_ids.push_back(sampled.token);
  out.text += check.text;
  if (sampled.logprob) out.logprobs.push_back(*sampled.logprob);
  if (sequence.prompt_logprobs && sequence.num_output_tokens() == 1) out.prompt_logprobs = sample.prompt_logprobs;
  if (request.request.return_routed_experts) {
    // The rows computed since the last token: the prompt's with the first token, then the previous token's.
    const auto begin = sample.routed_experts.begin() + static_cast<std::ptrdiff_t>(sample.routed_ids_sent);
    out.routed_experts.insert(out.routed_experts.end(), begin, sample.routed_experts.end());
    sample.routed_ids_sent = sample.routed_experts.size();
  }
  if (!check.finish) return false;
  out.finish_reason = check.finish;
  out.stop_reason = std::move(check.stop_reason);
  finish_sample(sample, *check.finish);
  return true;
}

// Routed experts are not replayed for draft rows (as with speculative decoding), and rows that need the host decode one
// token per step.
bool EngineCore::can_jump_forward(const SampleState& sample) const {
  return !sample.request->request.return_routed_experts && !needs_host(sample);
}

bool EngineCore::jump_forward_pays(std::size_t forced, int32_t decoding) const {
  if (forced == 0) return false;
  // A step whose sequences have drafts of different lengths replays no decode graph, and with async scheduling (in
  // effect without speculative decoding, and for adaptive verification's plain steps) waiting for a step's tokens
  // exposes the host's work between steps: the whole batch pays that for the forced rows' tokens. Where neither
  // applies, a draft costs only its own rows.
  const bool launches_ahead = config_.async_scheduling && (!config_.speculative.enabled() || adaptive_ != nullptr);
  if (!launches_ahead && !runner_.replays_decode_graphs()) return true;
  // Then drafts pay only when every decoding sequence has one: on the H200 at batch 64, drafting once half of them
  // were forced still cost 20-27% of the unconstrained tokens/s (bench/results/2026-12-03-session8-final.md).
  return forced >= static_cast<std::size_t>(decoding);
}

bool EngineCore::jump_forward_ahead(const InFlightStep& step) const {
  if (!config_.jump_forward || tokenizer_ == nullptr) return false;
  std::size_t forced = 0;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i) {
    if (step.plan.scheduled[i].num_draft_tokens > 0) return true;  // launch_ahead places one token per sequence
    SampleState* sample = live_sample(step.ids[i]);
    if (sample == nullptr || sample->grammar == nullptr || !can_jump_forward(*sample)) continue;
    if (!sample->grammar->jump_forward_bytes().empty()) ++forced;
  }
  return jump_forward_pays(forced, static_cast<int32_t>(step.producing.size()));
}

bool EngineCore::next_step_plain(const InFlightStep& step) {
  if (!adaptive_ || std::any_of(step.plan.scheduled.begin(), step.plan.scheduled.end(),
                                [](const ScheduledSequence& s) { return s.num_draft_tokens > 0; }))
    return false;
  // The sequences that decode next: those whose every token is computed once `step` is (its token is being sampled),
  // with the room they will have after it.
  int32_t decoding = 0;
  std::vector<AdaptiveVerification::Candidate> candidates;
  for (Sequence* sequence : scheduler_.running()) {
    if (sequence->num_computed_tokens != sequence->num_tokens()) continue;
    ++decoding;
    const SampleState& sample = *samples_by_sequence_.at(sequence->id);
    if (needs_host(sample)) continue;
    const int32_t room = sample.request->max_tokens - sequence->num_output_tokens() - 2;
    if (room > 0) candidates.push_back({std::min(config_.speculative.num_speculative_tokens, room), {}});
  }
  if (candidates.empty()) return true;
  if (!adaptive_->should_draft(decoding, candidates, scheduler_.next_step_has_prompt_rows())) return true;
  draft_decided_ = true;
  return false;
}

bool EngineCore::propose_drafts() {
  const bool decided = std::exchange(draft_decided_, false);
  const SpeculativeConfig& spec = config_.speculative;
  const bool jump_forward = config_.jump_forward && tokenizer_ != nullptr;
  if (!spec.enabled() && !jump_forward) return false;
  struct Drafting {
    Sequence* sequence;
    SampleState* sample;
    int32_t max_tokens;
  };
  std::vector<Drafting> drafting;
  struct Forced {
    Sequence* sequence;
    std::vector<TokenId> tokens;
    int32_t room;
  };
  std::vector<Forced> forced_drafts;  // jump-forward's
  int32_t decoding = 0;  // one-token decodes of the step, drafting or not (the step's size for its cost)
  for (Sequence* sequence : scheduler_.running()) {
    if (sequence->num_computed_tokens + 1 != sequence->num_tokens()) continue;  // mid-prefill
    ++decoding;
    SampleState& sample = *samples_by_sequence_.at(sequence->id);
    sample.forced_draft = false;
    // Penalties, logit bias and min_tokens masks edit each row by the tokens before it on the host path; such
    // sequences decode one token per step.
    if (needs_host(sample)) continue;
    // Never past max_tokens: the draft and the target's token after it must fit.
    const int32_t room = sample.request->max_tokens - sequence->num_output_tokens() - 1;
    // Jump-forward: the grammar's forced tokens, rather than a speculative draft.
    if (jump_forward && sample.grammar != nullptr && room > 0 && can_jump_forward(sample)) {
      const std::vector<TokenId> forced = sample.grammar->jump_forward_tokens(
          *tokenizer_, static_cast<std::size_t>(std::min(room, kMaxJumpForwardTokens)));
      if (!forced.empty()) {
        forced_drafts.push_back({sequence, std::move(forced), room});
        continue;
      }
    }
    const int32_t k = std::min(spec.num_speculative_tokens, room);
    if (spec.enabled() && k > 0) drafting.push_back({sequence, &sample, k});
  }
  // Otherwise the forced rows are drafted for like the others (same outputs either way), and the step can replay a
  // decode graph or be launched ahead.
  const bool forced_pays = jump_forward_pays(forced_drafts.size(), decoding);
  for (Forced& forced : forced_drafts) {
    SampleState& sample = *samples_by_sequence_.at(forced.sequence->id);
    if (!forced_pays) {
      const int32_t k = std::min(spec.num_speculative_tokens, forced.room);
      if (spec.enabled() && k > 0) drafting.push_back({forced.sequence, &sample, k});
      continue;
    }
    forced.sequence->tokens.insert(forced.sequence->tokens.end(), forced.tokens.begin(), forced.tokens.end());
    forced.sequence->num_draft_tokens = static_cast<int32_t>(forced.tokens.size());
    sample.forced_draft = true;
    counters_.jump_forward_draft_tokens_total += forced.tokens.size();
  }
  if (drafting.empty()) return false;
  // What the step will cost depends on whether it runs op by op anyway (prompt rows) or can replay a graph.
  const bool prompt_rows = adaptive_ && scheduler_.next_step_has_prompt_rows();
  if (adaptive_) {
    std::vector<AdaptiveVerification::Candidate> candidates;
    for (const Drafting& d : drafting) candidates.push_back({d.max_tokens, {}});
    if (!decided && !adaptive_->should_draft(decoding, candidates, prompt_rows)) return false;
  }
  std::vector<DraftProposal> drafts;
  if (spec.method == SpeculativeMethod::DFlash) {
    // One drafter pass for every drafting sequence; each keeps what its room allows.
    std::vector<DraftRequest> requests;
    for (const Drafting& d : drafting)
      requests.push_back({d.sequence->id, d.sequence->num_tokens() - 1, d.sequence->tokens.back()});
    drafts = runner_.propose_drafts(requests, spec.num_speculative_tokens);
  } else {
    for (const Drafting& d : drafting)
      drafts.push_back({propose_ngram_draft(d.sequence->token_span(), spec.prompt_lookup_min, spec.prompt_lookup_max,
                                            d.max_tokens), {}});
  }
  for (std::size_t i = 0; i < drafting.size(); ++i) {
    auto& [sequence, sample, max_tokens] = drafting[i];
    std::vector<TokenId>& draft = drafts[i].tokens;
    if (static_cast<int32_t>(draft.size()) > max_tokens) draft.resize(static_cast<std::size_t>(max_tokens));
    // A constrained sequence drafts only what its grammar allows: a later token could never be kept.
    if (sample->grammar != nullptr) draft.resize(allowed_prefix(*sample->grammar, draft));
    if (drafts[i].confidence.size() > draft.size()) drafts[i].confidence.resize(draft.size());
  }
  if (adaptive_) {
    std::vector<AdaptiveVerification::Candidate> candidates;
    for (const DraftProposal& draft : drafts)
      candidates.push_back({static_cast<int32_t>(draft.tokens.size()), draft.confidence});
    const std::vector<int32_t> verify = adaptive_->choose(decoding, candidates, true, prompt_rows);
    for (std::size_t i = 0; i < drafts.size(); ++i) {
      drafts[i].tokens.resize(static_cast<std::size_t>(verify[i]));
      if (drafts[i].confidence.size() > drafts[i].tokens.size()) drafts[i].confidence.resize(drafts[i].tokens.size());
    }
  }
  for (std::size_t i = 0; i < drafting.size(); ++i) {
    auto& [sequence, sample, max_tokens] = drafting[i];
    const std::vector<TokenId>& draft = drafts[i].tokens;
    sequence->tokens.insert(sequence->tokens.end(), draft.begin(), draft.end());
    sequence->num_draft_tokens = static_cast<int32_t>(draft.size());
    sample->draft_confidence = std::move(drafts[i].confidence);
  }
  return true;
}

EngineCore::DecodeShape EngineCore::decode_shape(const InFlightStep& step) {
  DecodeShape shape;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i) {
    const ScheduledSequence& scheduled = step.plan.scheduled[i];
    if (scheduled.num_new_tokens != 1 + scheduled.num_draft_tokens || scheduled.logit_index < 0 ||
        step.plan.batch.sequences[i].context_begin < scheduled.sequence->num_prompt_tokens) {
      shape.prompt_rows = true;
      continue;
    }
    ++shape.decoding;
    shape.draft_tokens += scheduled.num_draft_tokens;
  }
  return shape;
}

void EngineCore::record_step_cost(const DecodeShape& shape, bool drafted, Clock::time_point started) {
  const SpeculativeConfig& spec = config_.speculative;
  const double seconds = spec.step_seconds_for_testing
                             ? spec.step_seconds_for_testing(shape.decoding, shape.draft_tokens, drafted)
                             : seconds_between(started, Clock::now());
  adaptive_->record_step(shape.decoding, shape.draft_tokens, drafted, seconds, shape.prompt_rows);
}

void EngineCore::commit_draft_context(const InFlightStep& step) {
  if (!runner_.has_drafter()) return;
  std::vector<StepVerified> rows;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i) {
    const SequenceSlice& slice = step.plan.batch.sequences[i];
    rows.push_back({step.ids[i], static_cast<int32_t>(i), slice.context_begin + (slice.token_end - slice.token_begin)});
  }
  runner_.commit_draft_context(rows);
}

void EngineCore::truncate_draft_context(const InFlightStep& step) {
  if (!runner_.has_drafter()) return;
  for (std::size_t i = 0; i < step.plan.scheduled.size(); ++i) {
    const SampleState* sample = live_sample(step.ids[i]);
    if (sample != nullptr && step.plan.scheduled[i].num_draft_tokens > 0)
      runner_.truncate_draft_context(step.ids[i], sample->sequence.num_computed_tokens);
  }
}

void EngineCore::add_draft_rows(SampleState& sample, int32_t logit_row, int32_t num_drafts,
                                std::vector<RowSampling>& rows) {
  const SamplingParams& params = sample.request->request.sampling;
  const std::vector<TokenId>& tokens = sample.sequence.tokens;
  for (int32_t j = 0; j <= num_drafts; ++j) {
    RowSampling row;
    row.settings = sample_settings(params, sample.sampler, logit_row + j);  // draws the acceptance uniform
    // Greedy rows and the row after the last draft are sampled as usual: the token that comes out is the target's.
    // So are a forced draft's rows: each draws the uniform its position would draw without the draft, and the draft
    // is kept as far as the sampled tokens equal it (each with the target's probability of that token, as a
    // speculative draft's verification would keep it), so the outputs are those without the draft, token for token.
    if (j < num_drafts && !params.greedy() && !sample.forced_draft) {
      const TokenId draft = tokens[tokens.size() - num_drafts + j];
      const double residual_uniform = sample.sampler.next_uniform();
      row.sample_on_host = [settings = row.settings, draft, residual_uniform,
                            acceptance = &config_.speculative.acceptance_for_testing](std::span<const float> raw) {
        return verify_draft_token(raw, settings, draft, residual_uniform, *acceptance);
      };
    }
    rows.push_back(std::move(row));
  }
}

std::vector<SampledToken> EngineCore::settle_drafts(SampleState& sample, int32_t num_drafts,
                                                    std::vector<SampledToken> rows) {
  Sequence& sequence = sample.sequence;
  const std::size_t first_draft = sequence.tokens.size() - num_drafts;
  // A verified row returns its draft token exactly when it accepts it (a rejection draws from p without it).
  int32_t accepted = 0;
  while (accepted < num_drafts && rows[accepted].token == sequence.tokens[first_draft + accepted]) ++accepted;
  rows.resize(accepted + 1);
  for (int32_t j = 0; j <= accepted; ++j) sample.sampler.record_output(rows[j].token);

  scheduler_.settle_drafts(sequence, accepted);
  sequence.tokens.resize(sequence.tokens.size() - accepted);  // emit() appends them again, one stop check each
  if (sample.forced_draft) {
    if (!sample.request->request.sampling.greedy()) sample.sampler.take_back(num_drafts - accepted);
    counters_.jump_forward_accepted_tokens_total += accepted;
    return rows;
  }
  if (adaptive_) {
    const std::span<const float> confidence(sample.draft_confidence);
    adaptive_->record_verification(confidence.first(std::min(confidence.size(), static_cast<std::size_t>(num_drafts))),
                                   num_drafts, accepted);
  }
  ++counters_.spec_decode_num_drafts_total;
  counters_.spec_decode_num_draft_tokens_total += num_drafts;
  counters_.spec_decode_num_accepted_tokens_total += accepted;
  auto& per_position = counters_.spec_decode_num_accepted_tokens_per_pos;
  if (per_position.size() < static_cast<std::size_t>(num_drafts)) per_position.resize(num_drafts, 0);
  for (int32_t j = 0; j < accepted; ++j) ++per_position[j];
  return rows;
}

void EngineCore::sample_rows(InFlightStep& step, const std::vector<std::size_t>& which) {
  std::vector<RowSampling> rows;
  for (const std::size_t p : which) {
    const ScheduledSequence& scheduled = step.plan.scheduled[step.producing[p]];
    const int32_t logit_row = scheduled.logit_index;
    SampleState* sample = samples_by_sequence_.at(step.ids[step.producing[p]]);
    if (scheduled.num_draft_tokens > 0) {
      const std::size_t first = rows.size();
      add_draft_rows(*sample, logit_row, scheduled.num_draft_tokens, rows);
      for (std::size_t r = first; r < rows.size(); ++r) step.sampled.push_back({p, static_cast<bool>(rows[r].sample_on_host)});
      continue;
    }
    RowSampling row;
    if (needs_host(*sample)) {
      row.settings.logit_row = logit_row;
      row.sample_on_host = [sample, mode = config_.logprobs_mode](std::span<const float> raw_logits) {
        return sample_token(raw_logits, sample->request->request.sampling, sample->sampler,
                            sample->stop.masked_tokens(sample->sequence.num_output_tokens()), mode);
      };
    } else {
      row.settings = sample_settings(sample->request->request.sampling, sample->sampler, logit_row);
    }
    step.sampled.push_back({p, static_cast<bool>(row.sample_on_host)});
    rows.push_back(std::move(row));
  }
  fill_grammar_masks(step, rows);
  step.model->sample(std::move(rows));
}

void EngineCore::fill_grammar_masks(const InFlightStep& step, std::vector<RowSampling>& rows) {
  const std::size_t first = step.sampled.size() - rows.size();  // the rows' entries, appended by sample_rows
  const auto mask_words = static_cast<std::size_t>((runner_.vocab_size() + 31) / 32);
  // A sequence's rows are consecutive: one, or with a draft one per draft token plus one.
  std::vector<std::pair<std::size_t, std::size_t>> groups;  // (first row, rows)
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (r > 0 && step.sampled[first + r].producing == step.sampled[first + r - 1].producing) ++groups.back().second;
    else groups.emplace_back(r, 1);
  }
  // Most steps constrain no row: no pool threads are woken for them (a step of 16 sequences would wake 16).
  const bool constrained = std::any_of(groups.begin(), groups.end(), [&](const auto& group) {
    return samples_by_sequence_.at(step.ids[step.producing[step.sampled[first + group.first].producing]])->grammar != nullptr;
  });
  if (!constrained) return;
  // In parallel over sequences: each reads only its own sample's matcher. A small vocabulary's masks take a few
  // hundred ns each, less than waking a pool thread, so a chunk holds at least 64K tokens' worth of rows.
  const std::size_t min_chunk = std::max<std::size_t>(1, 65536 / std::max<std::size_t>(1, mask_words * 32));
  ThreadPool::global().parallel_for(groups.size(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t g = begin; g < end; ++g) {
      const auto [row, count] = groups[g];
      SampleState* sample = samples_by_sequence_.at(step.ids[step.producing[step.sampled[first + row].producing]]);
      if (sample->grammar == nullptr) continue;
      // Row j's mask is the grammar's after the draft's first j tokens; the matcher goes back to where it was.
      const std::vector<TokenId>& tokens = sample->sequence.tokens;
      const std::size_t draft_begin = tokens.size() - (count - 1);
      for (std::size_t j = 0; j < count; ++j) {
        rows[row + j].allowed_tokens.assign(mask_words, 0u);
        sample->grammar->fill_next_token_mask(rows[row + j].allowed_tokens);
        if (j + 1 < count)
          require(sample->grammar->accept_token(tokens[draft_begin + j]), "structured outputs: draft token {} is "
                  "outside the grammar", tokens[draft_begin + j]);
      }
      sample->grammar->rollback(static_cast<int32_t>(count - 1));
    }
  }, min_chunk);
}

std::vector<std::vector<SampledToken>> EngineCore::sample_tokens(InFlightStep& step) {
  if (!step.sampled_at_launch) {
    std::vector<std::size_t> live;
    for (std::size_t p = 0; p < step.producing.size(); ++p)
      if (live_sample(step.ids[step.producing[p]]) != nullptr) live.push_back(p);
    sample_rows(step, live);
  }
  std::vector<SampledToken> tokens = step.model->tokens();
  std::vector<std::vector<SampledToken>> sampled(step.producing.size());
  for (std::size_t d = 0; d < step.sampled.size(); ++d) {
    const SampledRow& row = step.sampled[d];
    const std::size_t scheduled = step.producing[row.producing];
    SampleState* sample = live_sample(step.ids[scheduled]);
    // A draft's rows record only the tokens it keeps (settle_drafts).
    if (sample != nullptr && !row.on_host && step.plan.scheduled[scheduled].num_draft_tokens == 0)
      sample->sampler.record_output(tokens[d].token);
    sampled[row.producing].push_back(std::move(tokens[d]));
  }
  return sampled;
}

EngineStats EngineCore::stats() const {
  EngineStats stats = counters_;
  stats.num_running = scheduler_.num_running();
  stats.num_waiting = scheduler_.num_waiting();
  stats.kv_blocks_total = kv_.pool().num_blocks();
  stats.kv_blocks_free = kv_.pool().num_free();
  stats.kv_cache_usage = kv_.usage();
  stats.kv_cache_bytes = static_cast<int64_t>(kv_.pool().num_blocks()) * runner_.kv_bytes_per_block();
  const auto& groups = kv_.layout().group_is_sliding;
  const auto full_groups = std::max<int64_t>(1, std::count(groups.begin(), groups.end(), false));
  stats.kv_token_capacity = static_cast<int64_t>(kv_.pool().num_blocks()) * kv_.block_size() / full_groups;
  const kv::PrefixCacheCounters prefix = kv_.prefix_counters();
  stats.prefix_cache_queries_total = prefix.queries;
  stats.prefix_cache_hits_total = prefix.hits;
  stats.preemptions_total = scheduler_.num_preemptions();
  stats.kv_hybrid_saved_bytes = 0;
  for (const Sequence* sequence : scheduler_.running()) stats.kv_hybrid_saved_bytes += saved_bytes(*sequence);
  return stats;
}

}  // namespace beamline
