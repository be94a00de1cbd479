#include "server/rollout_control.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <system_error>

#include "engine/engine_core.h"
#include "server/request_fields.h"

namespace beamline::server {

namespace {

// A parameter from the query string, else from the body (a string there as in the query).
std::optional<std::string> parameter(const ControlRequest& request, const std::string& key) {
  if (const auto found = request.query.find(key); found != request.query.end()) return found->second;
  const Json* value = find_field(request.body, key);
  if (value == nullptr) return std::nullopt;
  if (value->is_string()) return value->get<std::string>();
  if (value->is_boolean()) return value->get<bool>() ? "true" : "false";
  if (value->is_number_integer()) return std::to_string(value->get<int64_t>());
  throw invalid_request(key, fmt::format("{}: expected a string, boolean or integer, got {}", key, value->type_name()));
}

std::optional<bool> bool_parameter(const ControlRequest& request, const std::string& key) {
  const std::optional<std::string> text = parameter(request, key);
  if (!text) return std::nullopt;
  if (*text == "true" || *text == "True" || *text == "1") return true;
  if (*text == "false" || *text == "False" || *text == "0") return false;
  throw invalid_request(key, fmt::format("{}: expected true or false, got '{}'", key, *text));
}

const std::set<std::string> kSleepTags = {"weights", "kv_cache"};

}  // namespace

RolloutControl::RolloutControl(ServingContext& context, std::optional<std::filesystem::path> weight_update_dir)
    : context_(context) {
  if (weight_update_dir) {
    std::error_code error;
    weight_update_dir_ = std::filesystem::canonical(*weight_update_dir, error);
    require(!error && std::filesystem::is_directory(*weight_update_dir_),
            "--weight-update-dir {}: not a directory", weight_update_dir->string());
  }
}

Json RolloutControl::pause(const ControlRequest& request) {
  // vLLM's `mode`; its older `wait_for_inflight_requests` (true: wait, false: abort) when no mode is given.
  PauseMode mode = PauseMode::Abort;
  if (const std::optional<std::string> name = parameter(request, "mode")) {
    if (*name == "abort") {
      mode = PauseMode::Abort;
    } else if (*name == "wait") {
      mode = PauseMode::Wait;
    } else if (*name == "keep") {
      mode = PauseMode::Keep;
    } else {
      throw invalid_request("mode", fmt::format("mode: '{}' is not one of abort, wait, keep", *name));
    }
  } else if (bool_parameter(request, "wait_for_inflight_requests").value_or(false)) {
    mode = PauseMode::Wait;
  }
  const bool clear_cache = bool_parameter(request, "clear_cache").value_or(true);
  std::lock_guard lock(mutex_);
  context_.engine.pause(mode);
  if (clear_cache) context_.engine.run_between_steps([](EngineCore& core, ModelRunner&) { core.reset_prefix_cache(); });
  return Json{{"status", "paused"}};
}

Json RolloutControl::resume() {
  std::lock_guard lock(mutex_);
  if (!asleep_.empty()) {
    throw invalid_request("", "the engine is asleep: /wake_up first (it resumes generation once everything is awake)");
  }
  context_.engine.resume();
  return Json{{"status", "resumed"}};
}

Json RolloutControl::is_paused() const { return Json{{"is_paused", context_.engine.paused()}}; }

Json RolloutControl::sleep(const ControlRequest& request) {
  const std::optional<std::string> level_text = parameter(request, "level");
  const std::string level = level_text.value_or("1");
  if (level != "1" && level != "2") throw invalid_request("level", fmt::format("level: expected 1 or 2, got '{}'", level));
  std::lock_guard lock(mutex_);
  // Requests in flight are kept and continue after /wake_up; the KV cache's contents are dropped (vLLM: level 1
  // and 2 both discard it), so nothing cached is reused.
  context_.engine.pause(PauseMode::Keep);
  context_.engine.run_between_steps([](EngineCore& core, ModelRunner&) { core.reset_prefix_cache(); });
  asleep_ = kSleepTags;
  sleeping_ = true;
  spdlog::info("sleeping (level {}); device memory is kept (see docs/rl.md)", level);
  return Json{{"status", "sleeping"}, {"level", std::stoi(level)}};
}

Json RolloutControl::wake_up(const ControlRequest& request) {
  std::set<std::string> tags = kSleepTags;
  if (const auto query = request.query.find("tags"); query != request.query.end()) {
    tags = {query->second};
  } else if (const Json* body_tags = find_field(request.body, "tags"); body_tags != nullptr && body_tags->is_array()) {
    // vLLM reads `tags` from the query only; a list in the body is taken too (a non-list there is ignored, as vLLM
    // ignores the body, since SkyRL sends {"tags": 1} by default).
    tags.clear();
    for (const Json& tag : *body_tags) {
      if (!tag.is_string()) throw invalid_request("tags", "tags: expected a list of strings");
      tags.insert(tag.get<std::string>());
    }
  }
  for (const std::string& tag : tags) {
    if (!kSleepTags.contains(tag)) throw invalid_request("tags", fmt::format("tags: '{}' is not weights or kv_cache", tag));
  }
  std::lock_guard lock(mutex_);
  const bool was_asleep = !asleep_.empty();
  for (const std::string& tag : tags) asleep_.erase(tag);
  if (was_asleep && asleep_.empty()) {
    sleeping_ = false;
    context_.engine.resume();
  }
  return Json{{"status", asleep_.empty() ? "awake" : "sleeping"}};
}

Json RolloutControl::is_sleeping() const { return Json{{"is_sleeping", sleeping_.load()}}; }

Json RolloutControl::reset_prefix_cache() {
  std::lock_guard lock(mutex_);
  context_.engine.run_between_steps([](EngineCore& core, ModelRunner&) { core.reset_prefix_cache(); });
  return Json{{"success", true}};
}

std::filesystem::path RolloutControl::checked_model_path(const ControlRequest& request) const {
  if (!weight_update_dir_) {
    throw invalid_request("model_path", "model_path: loading weights from disk is off; start the server with "
                                        "--weight-update-dir DIR to allow directories under DIR");
  }
  const std::optional<std::string> text = parameter(request, "model_path");
  if (!text || text->empty()) throw invalid_request("model_path", "model_path: missing (a safetensors directory)");
  std::error_code error;
  const std::filesystem::path path = std::filesystem::canonical(*text, error);
  if (error || !std::filesystem::is_directory(path)) {
    throw invalid_request("model_path", fmt::format("model_path: {} is not a directory", *text));
  }
  // Compared after resolving links and "..", so neither leads out of the allowed directory.
  const auto [dir_end, path_end] = std::mismatch(weight_update_dir_->begin(), weight_update_dir_->end(), path.begin(),
                                                 path.end());
  if (dir_end != weight_update_dir_->end()) {
    throw invalid_request("model_path", fmt::format("model_path: {} is outside --weight-update-dir {}", *text,
                                                    weight_update_dir_->string()));
  }
  return path;
}

Json RolloutControl::update_weights_from_disk(const ControlRequest& request) {
  const std::filesystem::path path = checked_model_path(request);
  if (const std::optional<std::string> format = parameter(request, "load_format");
      format && *format != "auto" && *format != "safetensors") {
    throw invalid_request("load_format", fmt::format("load_format: '{}' is not auto or safetensors", *format));
  }
  const std::optional<std::string> version = parameter(request, "weight_version");
  const bool abort_all = bool_parameter(request, "abort_all_requests").value_or(false);
  std::lock_guard lock(mutex_);
  const bool was_paused = context_.engine.paused();
  if (abort_all && !was_paused) context_.engine.pause(PauseMode::Abort);
  try {
    // Between two steps: no step runs with a mix of old and new weights. The cached KV was computed with the old ones.
    context_.engine.run_between_steps([&](EngineCore& core, ModelRunner& runner) {
      runner.load_weights_from_disk(path);
      core.reset_prefix_cache();
    });
  } catch (const Error& failed) {
    if (abort_all && !was_paused) context_.engine.resume();
    throw invalid_request("model_path", fmt::format("update_weights_from_disk: {} (the served weights are unchanged)",
                                                    failed.what()));
  }
  if (abort_all && !was_paused) context_.engine.resume();
  ++updates_;
  context_.engine.set_weight_version(version.value_or(std::to_string(updates_)));
  const std::string message = fmt::format("loaded {}", path.string());
  return Json{{"success", true},
              {"message", message},
              {"num_paused_requests", 0},
              {kWeightVersionField, context_.engine.weight_version()}};
}

}  // namespace beamline::server
