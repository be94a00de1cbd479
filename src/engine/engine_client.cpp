#include "engine/engine_client.h"

#include <future>

#include "util/error.h"

namespace beamline {

EngineClient::EngineClient(std::vector<std::unique_ptr<Engine>> engines) : engines_(std::move(engines)) {
  require(!engines_.empty(), "engine client: no engine");
}

EngineClient::~EngineClient() { shutdown(ShutdownMode::Abort); }

std::shared_ptr<OutputStream> EngineClient::add_request(GenerationRequest request) {
  std::size_t start = 0;
  {
    std::lock_guard lock(next_mutex_);
    start = next_;
    next_ = (next_ + 1) % engines_.size();
  }
  std::size_t best = start;
  int64_t best_load = engines_[start]->num_unfinished_requests();
  for (std::size_t i = 1; i < engines_.size() && best_load > 0; ++i) {
    const std::size_t at = (start + i) % engines_.size();
    const int64_t load = engines_[at]->num_unfinished_requests();
    if (load < best_load) {
      best = at;
      best_load = load;
    }
  }
  return engines_[best]->add_request(std::move(request));
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
