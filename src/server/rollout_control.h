#pragma once
// The control endpoints an RL framework drives between rollouts, with vLLM's and SGLang's names and payloads
// (docs/rl.md): /pause, /resume, /is_paused, /sleep, /wake_up, /is_sleeping, /reset_prefix_cache (SGLang:
// /flush_cache), /update_weights_from_disk, and weight sync from a trainer: /init_weights_update_group,
// /update_weights_from_distributed, /destroy_weights_update_group (SGLang's names), or as SkyRL's remote engine calls a
// vLLM server, /init_weight_update_communicator and /update_weights (the same handlers). Parameters come from the query
// string (vLLM's) or a JSON body.
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "server/api_error.h"
#include "server/serving_context.h"
#include "weight_sync/weight_update_group.h"

namespace beamline::server {

// A control request: its query parameters and its body (an object; empty when none was sent).
struct ControlRequest {
  std::string endpoint;  // the name it was called by (its path without the '/'), for messages
  std::map<std::string, std::string> query;
  Json body = Json::object();
};

class RolloutControl {
 public:
  // `weight_update_dir`: the only directory (and those below it) /update_weights_from_disk reads; without it the
  // endpoint is refused. `weight_sync_timeout_seconds`: the longest a weight update group waits for its trainer
  // without progress (--distributed-timeout-seconds).
  RolloutControl(ServingContext& context, std::optional<std::filesystem::path> weight_update_dir,
                 double weight_sync_timeout_seconds);

  Json pause(const ControlRequest& request);
  Json resume();
  Json is_paused() const;
  Json sleep(const ControlRequest& request);
  Json wake_up(const ControlRequest& request);
  Json is_sleeping() const;
  Json reset_prefix_cache();
  Json update_weights_from_disk(const ControlRequest& request);
  Json init_weights_update_group(const ControlRequest& request);
  Json update_weights_from_distributed(const ControlRequest& request);
  Json destroy_weights_update_group(const ControlRequest& request);

 private:
  // Runs `load` between two steps (then resets the prefix cache when `flush_cache`) and sets the weight version; a
  // failure is a 400 naming the request's endpoint and `param`, the weights unchanged. Unless generation is paused already, the
  // requests in flight are aborted first with `abort_all_requests`, or with `wait_for_in_flight` waited for (new ones
  // held until the update is in).
  Json apply_weight_update(const ControlRequest& request, const std::string& param, bool flush_cache,
                           bool wait_for_in_flight, const std::function<void(ModelRunner&)>& load,
                           const std::string& message);
  // The model_path of an update, checked: a directory at or below --weight-update-dir.
  std::filesystem::path checked_model_path(const ControlRequest& request) const;

  ServingContext& context_;
  std::optional<std::filesystem::path> weight_update_dir_;  // canonical
  std::mutex mutex_;                                        // one control at a time; guards what follows
  std::set<std::string> asleep_;                            // "weights", "kv_cache": what /wake_up has not woken yet
  std::atomic<bool> sleeping_{false};                       // for /is_sleeping, which does not wait for a control
  int64_t updates_ = 0;                                     // successful weight updates
  double weight_sync_timeout_seconds_;
  // Weight update groups by group_name. Held while one receives, so a group moves one update at a time; separate from
  // `mutex_` so that the other controls answer during a transfer.
  std::mutex groups_mutex_;
  std::map<std::string, std::unique_ptr<WeightUpdateGroup>> groups_;
};

}  // namespace beamline::server
