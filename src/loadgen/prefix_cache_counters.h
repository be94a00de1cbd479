#pragma once
// The server's prefix-cache counters from its Prometheus /metrics (vLLM's names, which beamline keeps):
// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total, in tokens. Read before and after a run, their
// differences give the run's hit rate as the server counted it.
#include <optional>
#include <string>
#include <string_view>

namespace beamline::loadgen {

struct PrefixCacheCounters {
  double queries = 0;
  double hits = 0;
};

// The counters in a /metrics text (summed over label sets), or nullopt when it has neither.
std::optional<PrefixCacheCounters> parse_prefix_cache_counters(std::string_view metrics_text);

// GET {base_url}/metrics; nullopt when the server has no such endpoint or counters (not every server does).
std::optional<PrefixCacheCounters> read_prefix_cache_counters(const std::string& base_url,
                                                              const std::optional<std::string>& api_key);

// hits / queries between two readings; nullopt when either is missing or nothing was queried.
std::optional<double> hit_rate_between(const std::optional<PrefixCacheCounters>& before,
                                       const std::optional<PrefixCacheCounters>& after);

}  // namespace beamline::loadgen
