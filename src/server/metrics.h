#pragma once
// GET /metrics: Prometheus text format (version 0.0.4). Metrics vLLM also has keep vLLM's names (the
// `vllm:` prefix), so dashboards and load generators written for vLLM read them unchanged; metrics of
// beamline's own (hybrid-KV savings, pool size, HTTP counts) use the `beamline:` prefix.
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_stats.h"

namespace beamline::server {

// What the HTTP layer counts itself.
class HttpCounters {
 public:
  void count_response(int status);
  std::map<int, uint64_t> responses_by_status() const;
  std::atomic<int64_t> active_streams{0};

 private:
  mutable std::mutex mutex_;
  std::map<int, uint64_t> by_status_;
};

// The engines' metrics carry an `engine` label (their index: data-parallel replicas), as vLLM's do; the HTTP counts
// are the front end's. `engines` must not be empty.
std::string render_metrics(const std::vector<EngineStats>& engines, const std::map<int, uint64_t>& responses_by_status,
                           int64_t active_streams, const std::string& model_name);

// Label values escaped as the text format requires (backslash, double quote, newline).
std::string escape_label_value(const std::string& value);

}  // namespace beamline::server
