#include "engine/engine_client.h"

#include <condition_variable>
#include <exception>
#include <future>

#include "engine/engine_core.h"

#include "util/error.h"

namespace beamline {

EngineClient::EngineClient(std::vector<std::unique_ptr<Engine>> engines, DataParallelRouting routing)
    : engines_(std::move(engines)) {
  require(!engines_.empty(), "engine client: no engine");
  const EngineConfig& config = engines_.front()->config();
  if (routing == DataParallelRouting::PrefixAware && engines_.size() > 1 && config.enable_prefix_caching) {
    const int32_t blocks = engines_.front()->stats().kv_blocks_total;
    router_ = std::make_unique<PrefixRouter>(engines_.size(), config.block_size, static_cast<std::size_t>(blocks));
  }
}

EngineClient::~EngineClient() { shutdown(ShutdownMode::Abort); }

std::shared_ptr<OutputStream> EngineClient::add_request(GenerationRequest request) {
  std::size_t chosen = 0;
  {
    std::lock_guard lock(routing_mutex_);
    const std::size_t start = next_;
    next_ = (next_ + 1) % engines_.size();
    std::vector<int64_t> loads;
    for (const auto& engine : engines_) loads.push_back(engine->num_unfinished_requests());
    chosen = router_ ? router_->route(request.prompt, request.cache_salt, loads, start) : least_loaded_engine(loads, start);
  }
  return engines_[chosen]->add_request(std::move(request));
}

void EngineClient::abort(const std::string& request_id) {
  for (const auto& engine : engines_) engine->abort(request_id);
}

void EngineClient::shutdown(ShutdownMode mode) {
  for (auto engine = engines_.rbegin(); engine != engines_.rend(); ++engine) (*engine)->shutdown(mode);
}

void EngineClient::pause(PauseMode mode) {
  // All at once: one engine draining (PauseMode::Wait) must not leave the others scheduling new requests meanwhile.
  std::vector<std::future<void>> paused;
  for (const auto& engine : engines_)
    paused.push_back(std::async(std::launch::async, [&engine, mode] { engine->pause(mode); }));
  for (std::future<void>& done : paused) done.get();
}

void EngineClient::resume() {
  for (const auto& engine : engines_) engine->resume();
}

void EngineClient::run_between_steps(const std::function<void(EngineCore& core, ModelRunner& runner)>& task) {
  for (const auto& engine : engines_) engine->run_between_steps(task);
}

void EngineClient::run_on_model(const std::function<void(ModelRunner& runner)>& task,
                                const std::function<void(EngineCore& core)>& after) {
  if (engines_.size() == 1) {
    engines_.front()->run_between_steps([&](EngineCore& core, ModelRunner& runner) {
      task(runner);
      after(core);
    });
    return;
  }
  // Every engine thread stops in a task of its own; once all are there, engine 0's runs `task` and lets them go on.
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t arrived = 0;
  bool done = false, cancelled = false;
  std::exception_ptr failed;
  auto rendezvous = [&](std::size_t e, EngineCore& core, ModelRunner& runner) {
    runner.idle();  // the other replicas' steps no longer wait for this engine's batch
    std::unique_lock lock(mutex);
    ++arrived;
    changed.notify_all();
    if (e == 0) {
      changed.wait(lock, [&] { return arrived == engines_.size() || cancelled; });
      if (!cancelled) {
        lock.unlock();
        try {
          task(runner);
        } catch (...) {
          failed = std::current_exception();
        }
        lock.lock();
      }
      done = true;
      changed.notify_all();
    } else {
      changed.wait(lock, [&] { return done || cancelled; });
    }
    if (!failed && !cancelled) after(core);
  };
  std::vector<std::future<void>> parked;
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    parked.push_back(std::async(std::launch::async, [&, e] {
      try {
        engines_[e]->run_between_steps([&, e](EngineCore& core, ModelRunner& runner) { rendezvous(e, core, runner); });
      } catch (...) {
        std::lock_guard lock(mutex);
        if (arrived < engines_.size()) cancelled = true;  // it never arrived (shutting down): nobody waits for it
        changed.notify_all();
        throw;
      }
    }));
  }
  for (std::future<void>& each : parked) each.get();
  if (failed) std::rethrow_exception(failed);
}

void EngineClient::reset_prefix_cache() {
  run_between_steps([](EngineCore& core, ModelRunner&) { core.reset_prefix_cache(); });
  std::lock_guard lock(routing_mutex_);
  if (router_) router_->clear();
}

void EngineClient::set_weight_version(const std::string& version) {
  for (const auto& engine : engines_) engine->set_weight_version(version);
}

void EngineClient::load_lora_adapter(const std::string& name, const std::string& path) {
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    try {
      engines_[e]->load_lora_adapter(name, path);
    } catch (...) {
      for (std::size_t loaded = 0; loaded < e; ++loaded) engines_[loaded]->unload_lora_adapter(name);
      throw;
    }
  }
}

void EngineClient::unload_lora_adapter(const std::string& name) {
  for (const auto& engine : engines_) engine->unload_lora_adapter(name);
}

std::vector<EngineStats> EngineClient::stats() const {
  std::vector<EngineStats> all;
  for (const auto& engine : engines_) all.push_back(engine->stats());
  return all;
}

}  // namespace beamline
