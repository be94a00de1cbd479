#pragma once
// The serving engine: one thread owns the model and runs the loop
//   schedule (continuous batching, chunked prefill, hybrid paged KV with prefix caching)
//   -> ModelRunner::launch (forward pass and sampling) -> stop checks -> per-request output streams.
// Every public member is thread-safe; HTTP threads only add, abort and read streams.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <future>
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

// vLLM's /pause modes: what happens to the requests in flight. New requests are held (queued, not scheduled) until
// resume() in every mode.
enum class PauseMode {
  Abort,  // abort them (their streams end with FinishReason::Abort)
  Wait,   // let them finish; pause() returns when they have
  Keep,   // freeze them where they are; resume() continues them
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

  // Stops scheduling as `mode` says; returns when no step is in flight (with Wait: when the requests in flight ended).
  void pause(PauseMode mode);
  void resume();
  bool paused() const { return paused_.load(); }
  // Runs `task` on the engine thread between two steps, none in flight (a step launched ahead is finished first);
  // returns when it has run and rethrows what it threw. For changes a step must not see half-done (new weights).
  void run_between_steps(std::function<void(EngineCore& core, ModelRunner& runner)> task);
  // The served weights' version, reported with every response (/update_weights_from_disk sets it).
  std::string weight_version() const;
  void set_weight_version(std::string version);

  // Requests added and not yet ended (vLLM's get_num_unfinished_requests): what data-parallel load balancing
  // compares (engine/engine_client.h). Current, unlike stats().
  int64_t num_unfinished_requests() const;
  // LoRA adapters (--enable-lora, docs/lora.md); thread-safe. load_lora_adapter reads and checks the PEFT adapter in
  // `path` and puts it in a free slot between steps; requests name it by `name` (GenerationRequest::lora_name) once
  // it returns. Errors (InvalidRequest naming lora_name or lora_path): LoRA off, a name already loaded, every slot of
  // --max-loras taken, what the adapter's files break (file, key, tensor). unload_lora_adapter: an unknown name, or
  // requests in flight that use it.
  struct LoraAdapter {
    std::string name, path;
  };
  void load_lora_adapter(const std::string& name, const std::string& path);
  void unload_lora_adapter(const std::string& name);
  std::vector<LoraAdapter> lora_adapters() const;  // loaded, in name order

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
  std::vector<std::packaged_task<void()>> controls_;  // run_between_steps, on the engine thread
  // Requests added while paused or draining, handed to the core on resume. Engine thread only.
  std::vector<std::pair<GenerationRequest, std::shared_ptr<OutputStream>>> held_;
  enum class Scheduling { Running, Draining, Paused };
  Scheduling scheduling_ = Scheduling::Running;       // under inbox_mutex_
  std::condition_variable drained_;                   // scheduling_ went from Draining to Paused
  std::atomic<bool> paused_{false};
  std::string weight_version_ = "0";                  // under inbox_mutex_
  struct LoadedLora {
    std::string path;
    int32_t slot = 0;
    uint64_t id = 0;
    bool ready = false;  // false while loading: the slot is taken, requests cannot name it yet
  };
  std::map<std::string, LoadedLora> loras_;           // under inbox_mutex_
  uint64_t next_lora_id_ = 1;                         // under inbox_mutex_
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
