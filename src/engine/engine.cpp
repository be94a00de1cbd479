#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "engine/engine_core.h"

namespace beamline {

Engine::Engine(EngineConfig config, std::unique_ptr<ModelRunner> runner, std::shared_ptr<const Tokenizer> tokenizer,
               std::vector<TokenId> eos_token_ids)
    : config_(resolve_engine_config(config, *runner)),
      vocab_size_(runner->vocab_size()),
      tokenizer_(std::move(tokenizer)),
      runner_(std::move(runner)) {
  core_ = std::make_unique<EngineCore>(config_, *runner_, tokenizer_.get(), std::move(eos_token_ids));
  stats_ = core_->stats();
  const KvCacheLayout& layout = runner_->kv_layout();
  spdlog::info(
      "KV cache: {} blocks of {} tokens ({:.1f} MiB, {} KV groups, {} sliding); {} tokens of full-attention context "
      "fit, {} sequences of --max-model-len {} at once; prefix caching {}",
      layout.num_blocks, layout.block_size, static_cast<double>(stats_.kv_cache_bytes) / (1 << 20), layout.num_groups(),
      std::count(layout.group_is_sliding.begin(), layout.group_is_sliding.end(), true), stats_.kv_token_capacity,
      layout.num_blocks / core_->kv().max_blocks_for_sequence(config_.max_model_len, config_.max_num_batched_tokens),
      config_.max_model_len, config_.enable_prefix_caching ? "on" : "off");
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(ShutdownMode::Abort); }

std::shared_ptr<OutputStream> Engine::add_request(GenerationRequest request) {
  validate_request(request, RequestLimits{config_.max_model_len, vocab_size_, config_.max_logprobs, tokenizer_ != nullptr,
                                             config_.enable_return_routed_experts});
  auto stream = std::make_shared<OutputStream>(request.request_id);
  {
    std::lock_guard lock(inbox_mutex_);
    require(accepting_, "the engine is shutting down and takes no new requests");
    if (in_flight_ids_.contains(request.request_id)) {
      throw InvalidRequest("request_id", fmt::format("request id '{}' is already in flight", request.request_id));
    }
    if (!request.lora_name.empty()) {
      const auto lora = loras_.find(request.lora_name);
      if (lora == loras_.end() || !lora->second.ready)
        throw InvalidRequest("model", fmt::format("no LoRA adapter '{}' is loaded", request.lora_name));
      request.lora_slot = lora->second.slot;
      request.lora_id = lora->second.id;
    }
    in_flight_ids_.insert(request.request_id);
    new_requests_.emplace_back(std::move(request), stream);
  }
  inbox_ready_.notify_one();
  return stream;
}

void Engine::abort(const std::string& request_id) {
  {
    std::lock_guard lock(inbox_mutex_);
    aborts_.push_back(request_id);
  }
  inbox_ready_.notify_one();
}

void Engine::shutdown(ShutdownMode mode) {
  {
    std::lock_guard lock(inbox_mutex_);
    accepting_ = false;
    if (!stopping_ || mode == ShutdownMode::Abort) shutdown_mode_ = mode;
    stopping_ = true;
  }
  inbox_ready_.notify_one();
  if (thread_.joinable()) thread_.join();
}

int64_t Engine::num_unfinished_requests() const {
  std::lock_guard lock(inbox_mutex_);
  return static_cast<int64_t>(in_flight_ids_.size());
}

EngineStats Engine::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void Engine::pause(PauseMode mode) {
  run_between_steps([this, mode](EngineCore& core, ModelRunner&) {
    const std::vector<std::string> ended = mode == PauseMode::Abort ? core.abort_all() : std::vector<std::string>{};
    std::lock_guard lock(inbox_mutex_);
    for (const std::string& id : ended) in_flight_ids_.erase(id);
    scheduling_ = mode == PauseMode::Wait && core.has_work() ? Scheduling::Draining : Scheduling::Paused;
  });
  paused_ = true;
  std::unique_lock lock(inbox_mutex_);
  drained_.wait(lock, [&] { return scheduling_ != Scheduling::Draining || stopping_; });
}

void Engine::resume() {
  {
    std::lock_guard lock(inbox_mutex_);
    scheduling_ = Scheduling::Running;
  }
  paused_ = false;
  drained_.notify_all();
  inbox_ready_.notify_one();
}

void Engine::run_between_steps(std::function<void(EngineCore& core, ModelRunner& runner)> task) {
  std::packaged_task<void()> control([this, task = std::move(task)] {
    const std::vector<std::string> ended = core_->settle();
    {
      std::lock_guard lock(inbox_mutex_);
      for (const std::string& id : ended) in_flight_ids_.erase(id);
    }
    task(*core_, *runner_);
  });
  std::future<void> done = control.get_future();
  {
    std::lock_guard lock(inbox_mutex_);
    require(!stopping_, "the engine is shutting down");
    controls_.push_back(std::move(control));
  }
  inbox_ready_.notify_one();
  done.get();
}

void Engine::load_lora_adapter(const std::string& name, const std::string& path) {
  if (!config_.enable_lora) throw InvalidRequest("lora_name", "LoRA adapters need the server to run with --enable-lora");
  if (name.empty()) throw InvalidRequest("lora_name", "lora_name must not be empty");
  int32_t slot = 0;
  {
    std::lock_guard lock(inbox_mutex_);
    if (loras_.contains(name))
      throw InvalidRequest("lora_name", fmt::format("the LoRA adapter '{}' has already been loaded", name));
    std::vector<bool> taken(static_cast<std::size_t>(config_.max_loras), false);
    for (const auto& [other, lora] : loras_) taken[static_cast<std::size_t>(lora.slot)] = true;
    while (slot < config_.max_loras && taken[static_cast<std::size_t>(slot)]) ++slot;
    if (slot == config_.max_loras)
      throw InvalidRequest("lora_name", fmt::format("{} LoRA adapters are loaded, the most --max-loras {} allows; unload "
                                                    "one first", loras_.size(), config_.max_loras));
    loras_[name] = LoadedLora{path, slot, next_lora_id_++, false};
  }
  try {
    run_between_steps([slot, path](EngineCore&, ModelRunner& runner) { runner.load_lora_adapter(slot, path); });
  } catch (const std::exception& error) {
    std::lock_guard lock(inbox_mutex_);
    loras_.erase(name);
    throw InvalidRequest("lora_path", error.what());
  }
  std::lock_guard lock(inbox_mutex_);
  loras_[name].ready = true;
}

void Engine::unload_lora_adapter(const std::string& name) {
  int32_t slot = 0;
  {
    std::lock_guard lock(inbox_mutex_);
    const auto lora = loras_.find(name);
    if (lora == loras_.end() || !lora->second.ready)
      throw InvalidRequest("lora_name", fmt::format("the LoRA adapter '{}' cannot be found", name));
    slot = lora->second.slot;
    lora->second.ready = false;  // no new request can name it; the slot stays taken until it is emptied
  }
  // On the engine thread the requests that resolved the name are in the core, held, or still in the inbox; a request
  // whose last tokens its client has read is out of the core by then.
  try {
    run_between_steps([this, slot, &name](EngineCore& core, ModelRunner& runner) {
      std::size_t users = core.uses_lora_slot(slot) ? 1 : 0;
      for (const auto& entry : held_) users += entry.first.lora_slot == slot ? 1 : 0;
      {
        std::lock_guard lock(inbox_mutex_);
        for (const auto& entry : new_requests_) users += entry.first.lora_slot == slot ? 1 : 0;
      }
      if (users > 0)
        throw InvalidRequest("lora_name", fmt::format("the LoRA adapter '{}' is used by requests in flight", name));
      runner.unload_lora_adapter(slot);
    });
  } catch (...) {
    std::lock_guard lock(inbox_mutex_);
    loras_[name].ready = true;
    throw;
  }
  std::lock_guard lock(inbox_mutex_);
  loras_.erase(name);
}

std::vector<Engine::LoraAdapter> Engine::lora_adapters() const {
  std::lock_guard lock(inbox_mutex_);
  std::vector<LoraAdapter> adapters;
  for (const auto& [name, lora] : loras_)
    if (lora.ready) adapters.push_back({name, lora.path});
  return adapters;
}

std::string Engine::weight_version() const {
  std::lock_guard lock(inbox_mutex_);
  return weight_version_;
}

void Engine::set_weight_version(std::string version) {
  std::lock_guard lock(inbox_mutex_);
  weight_version_ = std::move(version);
}

void Engine::loop() {
  constexpr std::chrono::milliseconds kStatsInterval(50);
  auto last_snapshot = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<std::pair<GenerationRequest, std::shared_ptr<OutputStream>>> arrivals;
    std::vector<std::string> aborts;
    std::vector<std::packaged_task<void()>> controls;
    bool stopping = false;
    ShutdownMode mode = ShutdownMode::Drain;
    {
      std::unique_lock lock(inbox_mutex_);
      const auto ready = [&] {
        return stopping_ || !new_requests_.empty() || !aborts_.empty() || !controls_.empty() ||
               (scheduling_ == Scheduling::Running && !held_.empty()) ||
               (scheduling_ != Scheduling::Paused && core_->has_work());
      };
      if (!ready()) {
        runner_->idle();
        inbox_ready_.wait(lock, ready);
      }
      arrivals.swap(new_requests_);
      aborts.swap(aborts_);
      controls.swap(controls_);
      stopping = stopping_;
      mode = shutdown_mode_;
      if (stopping) scheduling_ = Scheduling::Running;  // a shutdown ends a pause: drain or abort as asked
    }
    // Requests that arrive while paused or draining wait in held_, in arrival order, until resume().
    held_.insert(held_.end(), std::make_move_iterator(arrivals.begin()), std::make_move_iterator(arrivals.end()));
    for (const std::string& id : aborts) {
      const auto held = std::find_if(held_.begin(), held_.end(), [&](const auto& entry) { return entry.first.request_id == id; });
      if (held == held_.end()) continue;
      // Handed to the core only to be aborted there, which ends its stream the usual way.
      core_->add_request(std::move(held->first), std::move(held->second));
      held_.erase(held);
    }
    for (const std::string& id : aborts) core_->abort_request(id);
    for (std::packaged_task<void()>& control : controls) control();
    if (stopping) paused_ = false;
    Scheduling scheduling;
    {
      std::lock_guard lock(inbox_mutex_);
      scheduling = scheduling_;
    }
    if (scheduling == Scheduling::Running) {
      for (auto& [request, stream] : held_) core_->add_request(std::move(request), std::move(stream));
      held_.clear();
    }
    if (stopping && mode == ShutdownMode::Abort) core_->abort_all();

    std::vector<std::string> ended;
    if (scheduling != Scheduling::Paused && core_->has_work()) ended = core_->step();
    if (scheduling == Scheduling::Draining && !core_->has_work()) {
      std::lock_guard lock(inbox_mutex_);
      if (scheduling_ == Scheduling::Draining) scheduling_ = Scheduling::Paused;
      drained_.notify_all();
    }
    // Snapshots cost a pass over the running sequences: take one per interval while busy, and when idle.
    const auto now = std::chrono::steady_clock::now();
    if (!core_->has_work() || now - last_snapshot >= kStatsInterval) {
      std::lock_guard lock(stats_mutex_);
      stats_ = core_->stats();
      last_snapshot = now;
    }
    {
      std::lock_guard lock(inbox_mutex_);
      for (const std::string& id : ended) in_flight_ids_.erase(id);
      for (const std::string& id : aborts) in_flight_ids_.erase(id);
      if (stopping && mode == ShutdownMode::Abort) in_flight_ids_.clear();
      if (stopping_ && !core_->has_work() && new_requests_.empty() && controls_.empty() && held_.empty()) {
        drained_.notify_all();
        runner_->idle();
        return;
      }
    }
  }
}

RequestOutput collect_output(OutputStream& stream) {
  RequestOutput result;
  bool first = true;
  while (auto event = stream.next()) {
    if (first) {
      result = std::move(*event);
      first = false;
    } else {
      merge_output(result, std::move(*event));
    }
  }
  return result;
}

}  // namespace beamline
