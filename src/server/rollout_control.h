#pragma once
// The control endpoints an RL framework drives between rollouts, with vLLM's and SGLang's names and payloads
// (docs/rl.md): /pause, /resume, /is_paused, /sleep, /wake_up, /is_sleeping, /reset_prefix_cache (SGLang:
// /flush_cache) and /update_weights_from_disk. Parameters come from the query string (vLLM's) or a JSON body.
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "server/api_error.h"
#include "server/serving_context.h"

namespace beamline::server {

// A control request: its query parameters and its body (an object; empty when none was sent).
struct ControlRequest {
  std::map<std::string, std::string> query;
  Json body = Json::object();
};

class RolloutControl {
 public:
  // `weight_update_dir`: the only directory (and those below it) /update_weights_from_disk reads; without it the
  // endpoint is refused.
  RolloutControl(ServingContext& context, std::optional<std::filesystem::path> weight_update_dir);

  Json pause(const ControlRequest& request);
  Json resume();
  Json is_paused() const;
  Json sleep(const ControlRequest& request);
  Json wake_up(const ControlRequest& request);
  Json is_sleeping() const;
  Json reset_prefix_cache();
  Json update_weights_from_disk(const ControlRequest& request);

 private:
  // The model_path of an update, checked: a directory at or below --weight-update-dir.
  std::filesystem::path checked_model_path(const ControlRequest& request) const;

  ServingContext& context_;
  std::optional<std::filesystem::path> weight_update_dir_;  // canonical
  std::mutex mutex_;                                        // one control at a time; guards what follows
  std::set<std::string> asleep_;                            // "weights", "kv_cache": what /wake_up has not woken yet
  std::atomic<bool> sleeping_{false};                       // for /is_sleeping, which does not wait for a control
  int64_t updates_ = 0;                                     // successful weight updates
};

}  // namespace beamline::server
