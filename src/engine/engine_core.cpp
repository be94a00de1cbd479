#include "engine/engine_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

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
      stop(tokenizer, owner->request.detokenize, owner->request.sampling, eos, max_tokens) {}

EngineCore::EngineCore(const EngineConfig& config, ModelRunner& runner, const Tokenizer* tokenizer,
                       std::vector<TokenId> eos_token_ids)
    : config_(config),
      runner_(runner),
      tokenizer_(tokenizer),
      eos_token_ids_(std::move(eos_token_ids)),
      vocab_size_(runner.vocab_size()),
      bytes_per_layer_token_(runner.kv_bytes_per_block() /
                             (static_cast<int64_t>(runner.kv_layout().slots_per_block) * runner.kv_layout().block_size)),
      kv_(runner.kv_layout(), runner.sliding_window(), config.enable_prefix_caching),
      scheduler_(SchedulerConfig{config.max_num_seqs, config.max_num_batched_tokens}, kv_),
      seeds_(config.seed) {}

EngineCore::~EngineCore() = default;

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
    sequence.cache_salt = r.cache_salt;
    if (i > 0 && config_.enable_prefix_caching) sequence.prompt_leader = &state->samples.front()->sequence;
    const uint64_t seed = sample_seed(r.sampling.seed, i, seeds_());
    state->samples.push_back(std::make_unique<SampleState>(state.get(), i, std::move(sequence), seed, tokenizer_,
                                                           eos_token_ids_, state->max_tokens));
  }
  for (auto& sample : state->samples) {
    samples_by_sequence_[sample->sequence.id] = sample.get();
    scheduler_.add(&sample->sequence);
  }
  counters_.prompt_tokens_total += r.prompt.size();
  requests_.emplace(r.request_id, std::move(state));
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

void EngineCore::abort_all() {
  std::vector<std::string> ids;
  for (const auto& [id, state] : requests_) ids.push_back(id);
  for (const std::string& id : ids) abort_request(id);
}

void EngineCore::fail_request(RequestState& request, const std::string& message) {
  for (auto& sample : request.samples) finish_sample(*sample, FinishReason::Error);
  request.pending.error = message;
}

std::vector<std::string> EngineCore::step() {
  std::vector<std::string> ended;
  StepPlan plan = scheduler_.schedule();
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
  const auto scheduled_at = Clock::now();
  for (const ScheduledSequence& s : plan.scheduled) {
    RequestState& request = *samples_by_sequence_.at(s.sequence->id)->request;
    if (!request.first_scheduled) request.first_scheduled = scheduled_at;
  }

  std::vector<const ScheduledSequence*> producing;
  for (const ScheduledSequence& s : plan.scheduled) {
    if (s.logit_index >= 0) producing.push_back(&s);
  }
  std::vector<SampledToken> sampled_tokens;
  try {
    const Tensor logits = runner_.forward(plan.batch);
    if (!plan.batch.logit_rows.empty()) {
      require(logits.rank() == 2 && logits.dim(0) == static_cast<int64_t>(plan.batch.logit_rows.size()) &&
                  logits.dim(1) == vocab_size_,
              "model runner returned logits {} for {} rows of {} tokens", describe(logits),
              plan.batch.logit_rows.size(), vocab_size_);
    }
    sampled_tokens = sample_tokens(producing, logits);
  } catch (const std::exception& error) {
    spdlog::error("forward step failed: {}; failing the {} requests in it", error.what(), plan.scheduled.size());
    std::vector<RequestState*> failed;
    for (const ScheduledSequence& s : plan.scheduled) {
      RequestState* request = samples_by_sequence_.at(s.sequence->id)->request;
      if (std::find(failed.begin(), failed.end(), request) == failed.end()) failed.push_back(request);
    }
    for (RequestState* request : failed) {
      fail_request(*request, std::string("the model failed: ") + error.what());
      flush(*request, ended);
    }
    return ended;
  }
  scheduler_.complete(plan);
  ++counters_.steps_total;

  const auto now = Clock::now();
  std::vector<RequestState*> touched;
  std::size_t next_sampled = 0;
  for (const ScheduledSequence& s : plan.scheduled) {
    SampleState& sample = *samples_by_sequence_.at(s.sequence->id);
    RequestState& request = *sample.request;
    if (std::find(touched.begin(), touched.end(), &request) == touched.end()) touched.push_back(&request);
    if (s.logit_index < 0) continue;
    Sequence& sequence = sample.sequence;
    const SampledToken& sampled = sampled_tokens[next_sampled++];
    sequence.tokens.push_back(sampled.token);
    ++counters_.generation_tokens_total;
    if (!request.first_token) {
      request.first_token = now;
      counters_.time_to_first_token.observe(seconds_between(request.arrival, now));
    } else if (sequence.num_output_tokens() > 1) {
      counters_.inter_token_latency.observe(seconds_between(sample.last_token_time, now));
    }
    sample.last_token_time = now;

    StopChecker::Result check = sample.stop.push(sampled.token, sequence.num_output_tokens());
    SampleOutput& out = pending_sample(sample);
    out.token_ids.push_back(sampled.token);
    out.text += check.text;
    if (sampled.logprob) out.logprobs.push_back(*sampled.logprob);
    if (check.finish) {
      out.finish_reason = check.finish;
      out.stop_reason = std::move(check.stop_reason);
      finish_sample(sample, *check.finish);
    }
  }
  for (RequestState* request : touched) flush(*request, ended);
  return ended;
}

std::vector<SampledToken> EngineCore::sample_tokens(const std::vector<const ScheduledSequence*>& producing,
                                             const Tensor& logits) {
  std::vector<SampledToken> sampled(producing.size());
  std::vector<SampleRow> device_rows;
  std::vector<std::size_t> on_device, on_host;
  int32_t max_logprobs = -1;
  for (std::size_t i = 0; i < producing.size(); ++i) {
    SampleState& sample = *samples_by_sequence_.at(producing[i]->sequence->id);
    const SamplingParams& params = sample.request->request.sampling;
    if (needs_host_edits(params, sample.stop.masked_tokens(sample.sequence.num_output_tokens()))) {
      on_host.push_back(i);
      continue;
    }
    device_rows.push_back(sample_settings(params, sample.sampler, producing[i]->logit_index));
    device_rows.back().num_logprobs = std::min(device_rows.back().num_logprobs, vocab_size_);
    on_device.push_back(i);
    max_logprobs = std::max(max_logprobs, device_rows.back().num_logprobs);
  }
  Backend& backend = runner_.backend();

  if (!device_rows.empty()) {
    const auto count = static_cast<int64_t>(device_rows.size());
    const int64_t width = std::max(1, max_logprobs);
    SampleOutputs out;
    out.tokens = backend.alloc(DType::I32, {count});
    if (max_logprobs >= 0) {
      out.logprobs = backend.alloc(DType::F32, {count});
      out.ranks = backend.alloc(DType::I32, {count});
      out.top_ids = backend.alloc(DType::I32, {count, width});
      out.top_logprobs = backend.alloc(DType::F32, {count, width});
    }
    backend.sample(logits, device_rows, out);
    const std::vector<int32_t> tokens = backend.download_i32(out.tokens);
    std::vector<float> logprobs, top_logprobs;
    std::vector<int32_t> ranks, top_ids;
    if (max_logprobs >= 0) {
      logprobs = backend.download_f32(out.logprobs);
      ranks = backend.download_i32(out.ranks);
      top_ids = backend.download_i32(out.top_ids);
      top_logprobs = backend.download_f32(out.top_logprobs);
    }
    for (std::size_t d = 0; d < on_device.size(); ++d) {
      SampledToken& result = sampled[on_device[d]];
      result.token = tokens[d];
      const int32_t wanted = device_rows[d].num_logprobs;
      if (wanted >= 0) {
        TokenLogprob& logprob = result.logprob.emplace();
        logprob.token = result.token;
        logprob.logprob = logprobs[d];
        logprob.rank = ranks[d];
        for (int32_t j = 0; j < wanted; ++j) {
          const auto at = static_cast<std::size_t>(static_cast<int64_t>(d) * width + j);
          logprob.top.emplace_back(top_ids[at], top_logprobs[at]);
        }
      }
      samples_by_sequence_.at(producing[on_device[d]]->sequence->id)->sampler.record_output(result.token);
    }
  }

  if (!on_host.empty()) {
    // Only these rows cross to the host, each as its own download of the logits tensor's row.
    const auto vocab = static_cast<std::size_t>(vocab_size_);
    std::vector<float> rows(on_host.size() * vocab);
    for (std::size_t h = 0; h < on_host.size(); ++h) {
      const auto row = static_cast<std::size_t>(producing[on_host[h]]->logit_index);
      const Tensor view(logits.device(), DType::F32, {vocab_size_},
                        logits.raw() + row * vocab * sizeof(float), nullptr);
      backend.download(view, rows.data() + h * vocab);
    }
    // Each row touches only its own sample's state, so the rows can be sampled in parallel.
    ThreadPool::global().parallel_for(
        on_host.size(),
        [&](std::size_t begin, std::size_t end) {
          for (std::size_t h = begin; h < end; ++h) {
            SampleState& sample = *samples_by_sequence_.at(producing[on_host[h]]->sequence->id);
            sampled[on_host[h]] = sample_token(std::span<const float>(rows.data() + h * vocab, vocab),
                                               sample.request->request.sampling, sample.sampler,
                                               sample.stop.masked_tokens(sample.sequence.num_output_tokens()));
          }
        },
        std::max<std::size_t>(1, 65536 / vocab));
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
