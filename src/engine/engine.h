#pragma once
// The serving engine: one thread owns the model and runs the loop
//   schedule (continuous batching, chunked prefill, hybrid paged KV with prefix caching)
//   -> ModelRunner::launch (forward pass and sampling) -> stop checks -> per-request output streams.
// Every public member is thread-safe; HTTP threads only add, abort and read streams.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_stats.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/request_output.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

class EngineCore;  // engine_core.h: the single-threaded state the loop drives

enum class ShutdownMode {
  Drain,  // refuse new requests, finish the in-flight ones
  Abort,  // refuse new requests, abort the in-flight ones (their streams end with FinishReason::Abort)
};

class Engine {
 public:
  // `tokenizer` may be null: then requests must not ask for detokenize or stop strings.
  // `eos_token_ids` end a sample unless it sets ignore_eos (generation_config.json's eos_token_id).
  // Fails (beamline::Error) when the KV pool cannot hold one sequence of max_model_len tokens.
  Engine(EngineConfig config, std::unique_ptr<ModelRunner> runner, std::shared_ptr<const Tokenizer> tokenizer,
         std::vector<TokenId> eos_token_ids);
  ~Engine();  // shutdown(ShutdownMode::Abort)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (InvalidRequest naming the field: prompt, max_tokens, n, logprobs, ...) and queues the request.
  // Throws Error after shutdown began. The stream ends with an event whose `finished` is true.
  std::shared_ptr<OutputStream> add_request(GenerationRequest request);
  // Aborts a request (e.g. its client went away): frees its blocks; its stream ends with FinishReason::Abort.
  // Unknown or already finished ids are ignored.
  void abort(const std::string& request_id);
  // Stops the loop after draining or aborting in-flight requests; returns when the engine thread has ended.
  void shutdown(ShutdownMode mode);

  // A snapshot taken by the engine thread: at most ~50 ms old while busy, current when idle.
  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }  // resolved: max_model_len and block_size filled in
  int32_t vocab_size() const { return vocab_size_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  void loop();

  EngineConfig config_;
  int32_t vocab_size_ = 0;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<EngineCore> core_;  // touched by the engine thread only (stats under stats_mutex_)

  mutable std::mutex inbox_mutex_;
  std::condition_variable inbox_ready_;
  std::vector<std::pair<GenerationRequest, std::shared_ptr<OutputStream>>> new_requests_;
  std::vector<std::string> aborts_;
  std::unordered_set<std::string> in_flight_ids_;
  bool accepting_ = true;
  bool stopping_ = false;
  ShutdownMode shutdown_mode_ = ShutdownMode::Drain;

  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  std::thread thread_;
};

// Reads a stream to its end and merges every event: the whole result of a request (tests, CLI).
RequestOutput collect_output(OutputStream& stream);

}  // namespace beamline
