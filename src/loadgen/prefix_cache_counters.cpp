#include "loadgen/prefix_cache_counters.h"

#include <httplib.h>

#include <cstdlib>

#include "loadgen/openai_stream_client.h"

namespace beamline::loadgen {

namespace {

// The sum of a metric's samples: lines "name value" or "name{labels} value".
std::optional<double> metric_sum(std::string_view text, std::string_view name) {
  std::optional<double> sum;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (!line.starts_with(name) || line.size() <= name.size()) continue;
    const char after = line[name.size()];
    if (after != ' ' && after != '{') continue;
    const std::size_t space = line.rfind(' ');
    const std::string value(line.substr(space + 1));
    char* parsed_end = nullptr;
    const double number = std::strtod(value.c_str(), &parsed_end);
    if (parsed_end == value.c_str()) continue;
    sum = sum.value_or(0) + number;
  }
  return sum;
}

}  // namespace

std::optional<PrefixCacheCounters> parse_prefix_cache_counters(std::string_view metrics_text) {
  const std::optional<double> queries = metric_sum(metrics_text, "vllm:prefix_cache_queries_total");
  const std::optional<double> hits = metric_sum(metrics_text, "vllm:prefix_cache_hits_total");
  if (!queries || !hits) return std::nullopt;
  return PrefixCacheCounters{*queries, *hits};
}

std::optional<PrefixCacheCounters> read_prefix_cache_counters(const std::string& base_url,
                                                              const std::optional<std::string>& api_key) {
  const SplitUrl url = split_url(base_url);
  httplib::Client client(url.base_url);
  if (!client.is_valid()) return std::nullopt;
  httplib::Headers headers;
  if (api_key) headers.emplace("Authorization", "Bearer " + *api_key);
  const httplib::Result response = client.Get(url.path + "/metrics", headers);
  if (!response || response->status != 200) return std::nullopt;
  return parse_prefix_cache_counters(response->body);
}

std::optional<double> hit_rate_between(const std::optional<PrefixCacheCounters>& before,
                                       const std::optional<PrefixCacheCounters>& after) {
  if (!before || !after || after->queries <= before->queries) return std::nullopt;
  return (after->hits - before->hits) / (after->queries - before->queries);
}

}  // namespace beamline::loadgen
