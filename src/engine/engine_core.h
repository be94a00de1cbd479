#pragma once
// The engine's state and one step of its loop, single-threaded: Engine runs it on its own thread, tests
// drive it step by step. A step = schedule, forward, sample, check stops, push events to the streams.
#include <chrono>
#include <cstdint>
#include <memory>
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
  void abort_all();
  bool has_work() const { return scheduler_.has_work(); }
  // One step; returns the ids of the requests that ended in it.
  std::vector<std::string> step();

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

  // The next token of each producing sequence from this step's logits: rows that need logit bias, penalties
  // or masked tokens are downloaded and sampled on the host, the rest by Backend::sample on the runner's
  // backend (only their tokens and requested logprobs come back).
  std::vector<SampledToken> sample_tokens(const std::vector<const ScheduledSequence*>& producing, const Tensor& logits);
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
  int32_t vocab_size_;
  int64_t bytes_per_layer_token_;
  kv::KvCacheManager kv_;
  Scheduler scheduler_;
  std::mt19937_64 seeds_;
  kv::SeqId next_sequence_id_ = 0;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<kv::SeqId, SampleState*> samples_by_sequence_;
  EngineStats counters_;
};

// Fills in max_model_len and block_size from the runner and checks them against it and against the pool:
// one sequence of max_model_len tokens must fit. An unset max_model_len becomes the model's context, cut
// to what the pool holds (with a warning). Throws Error naming the flag to change.
EngineConfig resolve_engine_config(const EngineConfig& config, const ModelRunner& runner);

}  // namespace beamline
