#pragma once
// The figures `vllm bench serve` reports, computed as it computes them (vllm/benchmarks/serve.py's
// calculate_metrics): TPOT per request as (E2EL - TTFT) / (output tokens - 1), ITL per chunk, throughput over the
// whole benchmark's duration, percentiles by linear interpolation (numpy's default), std over the population.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/request_result.h"

namespace beamline::loadgen {

struct MetricStats {
  double mean = 0, median = 0, std = 0;
  std::vector<std::pair<double, double>> percentiles;  // (percentile, value), in ms like the rest
};

struct ServeMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double duration = 0;  // seconds
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  int64_t max_concurrent_requests = 0;
  std::optional<double> prefix_cache_hit_rate;  // from the server's /metrics, where it has the counters
  std::map<std::string, MetricStats> latency;  // "ttft", "tpot", "itl", "e2el", in ms
};

// The metric names --percentile-metrics accepts, in the order the summary prints them.
const std::vector<std::string>& latency_metric_names();

// Parses "ttft,tpot,itl" (each one of latency_metric_names) and "50,90,99" (each in (0, 100]).
std::vector<std::string> parse_metric_names(const std::string& text);
std::vector<double> parse_percentiles(const std::string& text);

// numpy.percentile(values, p) with linear interpolation; 0 for no values (vLLM's `values or 0`).
double percentile(std::vector<double> values, double p);

ServeMetrics compute_metrics(const std::vector<RequestResult>& results, double duration, int64_t max_concurrent_requests,
                             const std::vector<double>& percentiles);

// The table vLLM prints ("============ Serving Benchmark Result ============" ...), for the selected metrics.
std::string format_summary(const ServeMetrics& metrics, const std::vector<std::string>& selected,
                           const std::string& max_concurrency_text, const std::string& request_rate_text);

// vLLM's result JSON fields: duration, completed, failed, total_input_tokens, total_output_tokens,
// request_throughput, output_throughput, total_token_throughput, max_concurrent_requests, prefix_cache_hit_rate
// (a fraction; null when the server has no counters) and, per selected metric,
// mean_/median_/std_/p<P>_<metric>_ms; with `detailed`, the per-request lists input_lens, output_lens, ttfts, itls,
// generated_texts, errors (seconds, as vLLM writes them).
nlohmann::json metrics_json(const ServeMetrics& metrics, const std::vector<std::string>& selected,
                            const std::vector<RequestResult>& results, bool detailed);

// A --max-concurrency sweep as a tab-separated table (header line first), one row per level: max_concurrency,
// request_throughput, output_throughput, total_token_throughput, then mean and median of TTFT, TPOT, ITL, E2EL in ms.
// Printed after the sweep and saved as .tsv for bench/plot_serve_sweep.sh.
std::string format_sweep_table(const std::vector<std::pair<std::string, ServeMetrics>>& rows);

// "99" for 99, "99.9" for 99.9: how vLLM names a percentile in labels and keys.
std::string percentile_label(double p);

}  // namespace beamline::loadgen
