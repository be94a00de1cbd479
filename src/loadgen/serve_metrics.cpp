#include "loadgen/serve_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "util/error.h"

namespace beamline::loadgen {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, separator);) {
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

MetricStats stats_ms(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  MetricStats stats;
  std::vector<double> ms(seconds.size());
  std::transform(seconds.begin(), seconds.end(), ms.begin(), [](double s) { return s * 1000.0; });
  if (!ms.empty()) {
    stats.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
    double squares = 0;
    for (double value : ms) squares += (value - stats.mean) * (value - stats.mean);
    stats.std = std::sqrt(squares / static_cast<double>(ms.size()));
  }
  stats.median = percentile(ms, 50);
  for (double p : percentiles) stats.percentiles.emplace_back(p, percentile(ms, p));
  return stats;
}

const char* metric_header(const std::string& name) {
  if (name == "ttft") return "Time to First Token";
  if (name == "tpot") return "Time per Output Token (excl. 1st token)";
  if (name == "itl") return "Inter-token Latency";
  return "End-to-end Latency";
}

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

// "{s:{c}^{n}}": s centred in n columns of c.
std::string centred(const std::string& text, char fill, std::size_t width) {
  if (text.size() >= width) return text;
  const std::size_t left = (width - text.size()) / 2;
  return std::string(left, fill) + text + std::string(width - text.size() - left, fill);
}

}  // namespace

const std::vector<std::string>& latency_metric_names() {
  static const std::vector<std::string> names = {"ttft", "tpot", "itl", "e2el"};
  return names;
}

std::vector<std::string> parse_metric_names(const std::string& text) {
  std::vector<std::string> names = split(text, ',');
  require(!names.empty(), "--percentile-metrics: name at least one of ttft, tpot, itl, e2el");
  for (const std::string& name : names) {
    const auto& known = latency_metric_names();
    require(std::find(known.begin(), known.end(), name) != known.end(),
            "--percentile-metrics: '{}' is not one of ttft, tpot, itl, e2el", name);
  }
  return names;
}

std::vector<double> parse_percentiles(const std::string& text) {
  std::vector<double> values;
  for (const std::string& part : split(text, ',')) {
    char* end = nullptr;
    const double value = std::strtod(part.c_str(), &end);
    require(end != part.c_str() && *end == '\0' && value > 0 && value <= 100,
            "--metric-percentiles: '{}' is not a percentile in (0, 100]", part);
    values.push_back(value);
  }
  require(!values.empty(), "--metric-percentiles: give at least one percentile, e.g. 99 or 50,90,99");
  return values;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double position = static_cast<double>(values.size() - 1) * p / 100.0;
  const auto low = static_cast<std::size_t>(std::floor(position));
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (position - static_cast<double>(low));
}

std::string percentile_label(double p) {
  if (p == std::floor(p)) return fmt::format("{}", static_cast<int64_t>(p));
  return fmt::format("{}", p);
}

ServeMetrics compute_metrics(const std::vector<RequestResult>& results, double duration, int64_t max_concurrent_requests,
                             const std::vector<double>& percentiles) {
  ServeMetrics metrics;
  metrics.duration = duration;
  metrics.max_concurrent_requests = max_concurrent_requests;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestResult& result : results) {
    if (!result.success) {
      ++metrics.failed;
      continue;
    }
    ++metrics.completed;
    metrics.total_input += result.prompt_len;
    metrics.total_output += result.output_tokens;
    if (result.output_tokens > 1) {
      tpots.push_back((result.latency - result.ttft) / static_cast<double>(result.output_tokens - 1));
    }
    itls.insert(itls.end(), result.itl.begin(), result.itl.end());
    ttfts.push_back(result.ttft);
    e2els.push_back(result.latency);
  }
  if (duration > 0) {
    metrics.request_throughput = static_cast<double>(metrics.completed) / duration;
    metrics.output_throughput = static_cast<double>(metrics.total_output) / duration;
    metrics.total_token_throughput = static_cast<double>(metrics.total_input + metrics.total_output) / duration;
  }
  metrics.latency["ttft"] = stats_ms(ttfts, percentiles);
  metrics.latency["tpot"] = stats_ms(tpots, percentiles);
  metrics.latency["itl"] = stats_ms(itls, percentiles);
  metrics.latency["e2el"] = stats_ms(e2els, percentiles);
  return metrics;
}

std::string format_summary(const ServeMetrics& metrics, const std::vector<std::string>& selected,
                           const std::string& max_concurrency_text, const std::string& request_rate_text) {
  std::string out;
  const auto line = [&](const std::string& label, const std::string& value) {
    out += fmt::format("{:<40} {:<10}\n", label, value);
  };
  const auto number = [](double value) { return fmt::format("{:.2f}", value); };
  out += centred(" Serving Benchmark Result ", '=', 50) + "\n";
  line("Successful requests:", std::to_string(metrics.completed));
  line("Failed requests:", std::to_string(metrics.failed));
  line("Maximum request concurrency:", max_concurrency_text);
  line("Request rate configured (RPS):", request_rate_text);
  line("Benchmark duration (s):", number(metrics.duration));
  line("Total input tokens:", std::to_string(metrics.total_input));
  line("Total generated tokens:", std::to_string(metrics.total_output));
  line("Request throughput (req/s):", number(metrics.request_throughput));
  line("Output token throughput (tok/s):", number(metrics.output_throughput));
  line("Peak concurrent requests:", std::to_string(metrics.max_concurrent_requests));
  line("Total Token throughput (tok/s):", number(metrics.total_token_throughput));
  if (metrics.prefix_cache_hit_rate) line("Prefix cache hit rate (%):", number(100 * *metrics.prefix_cache_hit_rate));
  for (const std::string& name : latency_metric_names()) {
    if (std::find(selected.begin(), selected.end(), name) == selected.end()) continue;
    const MetricStats& stats = metrics.latency.at(name);
    const std::string key = upper(name);
    out += centred(metric_header(name), '-', 50) + "\n";
    line(fmt::format("Mean {} (ms):", key), number(stats.mean));
    line(fmt::format("Median {} (ms):", key), number(stats.median));
    for (const auto& [p, value] : stats.percentiles) line(fmt::format("P{} {} (ms):", percentile_label(p), key), number(value));
  }
  out += std::string(50, '=') + "\n";
  return out;
}

std::string format_sweep_table(const std::vector<std::pair<std::string, ServeMetrics>>& rows) {
  std::string table = "max_concurrency\trequest_throughput\toutput_throughput\ttotal_token_throughput";
  for (const std::string& name : latency_metric_names()) table += fmt::format("\tmean_{0}_ms\tmedian_{0}_ms", name);
  table += '\n';
  for (const auto& [level, metrics] : rows) {
    table += fmt::format("{}\t{:.3f}\t{:.3f}\t{:.3f}", level, metrics.request_throughput, metrics.output_throughput,
                         metrics.total_token_throughput);
    for (const std::string& name : latency_metric_names()) {
      const MetricStats& stats = metrics.latency.at(name);
      table += fmt::format("\t{:.3f}\t{:.3f}", stats.mean, stats.median);
    }
    table += '\n';
  }
  return table;
}

nlohmann::json metrics_json(const ServeMetrics& metrics, const std::vector<std::string>& selected,
                            const std::vector<RequestResult>& results, bool detailed) {
  nlohmann::json json = {{"duration", metrics.duration},
                         {"completed", metrics.completed},
                         {"failed", metrics.failed},
                         {"total_input_tokens", metrics.total_input},
                         {"total_output_tokens", metrics.total_output},
                         {"request_throughput", metrics.request_throughput},
                         {"request_goodput", nullptr},
                         {"output_throughput", metrics.output_throughput},
                         {"total_token_throughput", metrics.total_token_throughput},
                         {"max_concurrent_requests", metrics.max_concurrent_requests},
                         {"prefix_cache_hit_rate", metrics.prefix_cache_hit_rate ? nlohmann::json(*metrics.prefix_cache_hit_rate)
                                                                                 : nlohmann::json()}};
  for (const std::string& name : selected) {
    const MetricStats& stats = metrics.latency.at(name);
    json[fmt::format("mean_{}_ms", name)] = stats.mean;
    json[fmt::format("median_{}_ms", name)] = stats.median;
    json[fmt::format("std_{}_ms", name)] = stats.std;
    for (const auto& [p, value] : stats.percentiles) json[fmt::format("p{}_{}_ms", percentile_label(p), name)] = value;
  }
  if (detailed) {
    nlohmann::json input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(),
                   ttfts = nlohmann::json::array(), itls = nlohmann::json::array(),
                   texts = nlohmann::json::array(), errors = nlohmann::json::array();
    for (const RequestResult& result : results) {
      input_lens.push_back(result.prompt_len);
      output_lens.push_back(result.output_tokens);
      ttfts.push_back(result.ttft);
      itls.push_back(result.itl);
      texts.push_back(result.generated_text);
      errors.push_back(result.error);
    }
    json["input_lens"] = std::move(input_lens);
    json["output_lens"] = std::move(output_lens);
    json["ttfts"] = std::move(ttfts);
    json["itls"] = std::move(itls);
    json["generated_texts"] = std::move(texts);
    json["errors"] = std::move(errors);
  }
  return json;
}

}  // namespace beamline::loadgen
