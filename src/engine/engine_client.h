#pragma once
// What the HTTP server talks to (vLLM's EngineClient): the engines of the data-parallel replicas (one without
// --data-parallel-size), each with its own scheduler and KV cache, behind one front end. A new request goes where
// the routing says (engine/prefix_router.h): to the engine with the fewest unfinished requests (ties: the next in
// turn), as vLLM's data-parallel load balancer does, or to the one that took its prompt's longest prefix; control
// calls (pause, resume, between-steps tasks, shutdown) reach every engine. Thread-safe as Engine is.
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/prefix_router.h"

namespace beamline {

class EngineClient {
 public:
  // At least one engine; engine 0's config, vocabulary and tokenizer stand for all (they serve the same model).
  // Prefix-aware routing needs prefix caching (else it is least-loaded) and matters only with several engines.
  explicit EngineClient(std::vector<std::unique_ptr<Engine>> engines,
                        DataParallelRouting routing = DataParallelRouting::LeastLoaded);
  ~EngineClient();  // shutdown(ShutdownMode::Abort), the engines in reverse order

  // Engine::add_request on the engine the routing picks.
  std::shared_ptr<OutputStream> add_request(GenerationRequest request);
  // Every engine ignores ids it does not hold, so the one that holds it aborts it.
  void abort(const std::string& request_id);
  void shutdown(ShutdownMode mode);
  // Every engine at once; returns when all are paused (with Wait: drained).
  void pause(PauseMode mode);
  void resume();
  bool paused() const { return engines_.front()->paused(); }
  // On every engine in turn (each between two of its steps).
  void run_between_steps(const std::function<void(EngineCore& core, ModelRunner& runner)>& task);
  // A change of the model the engines serve (new weights): `task` runs once, on engine 0's runner, while every engine
  // is stopped between two of its steps, and then `after` on every engine (each core, e.g. emptying its prefix cache)
  // before any of them steps again. The data-parallel replicas' runners are views of one model
  // (runner/data_parallel_runner.h), so no replica steps on the new weights with the old cache, or the other way round.
  // Rethrows what `task` threw (then `after` does not run); an engine that is shutting down makes it an Error.
  void run_on_model(const std::function<void(ModelRunner& runner)>& task,
                    const std::function<void(EngineCore& core)>& after);
  // Empties every engine's prefix cache (between steps) and what the router remembers of them.
  void reset_prefix_cache();
  // The routing in use, after the fallback above.
  DataParallelRouting routing() const { return router_ ? DataParallelRouting::PrefixAware : DataParallelRouting::LeastLoaded; }
  std::string weight_version() const { return engines_.front()->weight_version(); }
  void set_weight_version(const std::string& version);
  // LoRA adapters on every engine (Engine::load_lora_adapter); an engine that refuses leaves none holding it.
  void load_lora_adapter(const std::string& name, const std::string& path);
  void unload_lora_adapter(const std::string& name);
  std::vector<Engine::LoraAdapter> lora_adapters() const { return engines_.front()->lora_adapters(); }

  // One snapshot per engine, engine 0 first (/metrics labels them engine="0", ...).
  std::vector<EngineStats> stats() const;
  const EngineConfig& config() const { return engines_.front()->config(); }
  int32_t vocab_size() const { return engines_.front()->vocab_size(); }
  const Tokenizer* tokenizer() const { return engines_.front()->tokenizer(); }
  std::size_t num_engines() const { return engines_.size(); }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
  std::mutex routing_mutex_;
  std::size_t next_ = 0;                  // where the search for an engine starts: ties go round
  std::unique_ptr<PrefixRouter> router_;  // null: least-loaded
};

}  // namespace beamline
