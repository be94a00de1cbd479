// beamline bench serve: `vllm bench serve` against any running OpenAI-compatible server (src/loadgen).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "loadgen/datasets.h"
#include "loadgen/multi_turn_session.h"
#include "loadgen/prefix_cache_counters.h"
#include "loadgen/serve_benchmark.h"
#include "loadgen/serve_metrics.h"
#include "util/error.h"
#include "util/open_file_limit.h"
#include "util/progress_bar.h"

namespace beamline::cli {
namespace {

using namespace beamline::loadgen;

struct BenchServeOptions {
  std::string backend = "vllm";
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint;
  std::string model;
  std::vector<std::string> lora_modules;
  std::string dataset_name = "random";
  std::string dataset_path;
  int64_t num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  int64_t random_prefix_len = 0;
  std::string random_token_id_range = "0-255";
  int64_t custom_output_len = 256;
  int64_t num_sessions = 16;
  int64_t num_turns = 4;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  std::string max_concurrency;  // "" (unlimited), "N", or "N1,N2,..." (a sweep)
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  bool save_result = false;
  bool save_detailed = false;
  std::string result_dir;
  std::string result_filename;
};

double parse_request_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double rate = std::strtod(text.c_str(), &end);
  require(end != text.c_str() && *end == '\0' && rate > 0, "--request-rate: '{}' is not a positive number or inf", text);
  return rate;
}

// Python's str() of a float, as vLLM writes the rate into its file names and JSON ("inf", "8.0", "2.5").
std::string python_float(double value) {
  if (std::isinf(value)) return "inf";
  if (value == std::floor(value)) return fmt::format("{:.1f}", value);
  return fmt::format("{}", value);
}

std::pair<int64_t, int64_t> parse_id_range(const std::string& text) {
  const std::size_t dash = text.find('-');
  require(dash != std::string::npos, "--random-token-id-range: '{}' is not LOW-HIGH", text);
  try {
    return {std::stoll(text.substr(0, dash)), std::stoll(text.substr(dash + 1))};
  } catch (const std::exception&) {
    fail("--random-token-id-range: '{}' is not LOW-HIGH", text);
  }
}

// --max-concurrency: nothing (unlimited), one level, or a comma-separated sweep of levels.
std::vector<std::optional<int64_t>> parse_concurrency_levels(const std::string& text) {
  if (text.empty()) return {std::nullopt};
  std::vector<std::optional<int64_t>> levels;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    char* end = nullptr;
    const long long level = std::strtoll(part.c_str(), &end, 10);
    require(end != part.c_str() && *end == '\0' && level >= 1, "--max-concurrency: '{}' is not a positive count", part);
    levels.emplace_back(level);
  }
  require(!levels.empty(), "--max-concurrency: give a count or a comma-separated list of counts");
  return levels;
}

std::string local_timestamp(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, format, &local);
  return text;
}

std::string model_base_name(const std::string& model) { return std::filesystem::path(model).filename().string(); }

std::filesystem::path result_path(const BenchServeOptions& options, const std::string& file_name) {
  if (options.result_dir.empty()) return file_name;
  std::filesystem::create_directories(options.result_dir);
  return std::filesystem::path(options.result_dir) / file_name;
}

// vLLM's result JSON: the run's settings, then metrics_json's fields.
void save_result(const BenchServeOptions& options, double rate, std::optional<int64_t> max_concurrency,
                 const ServeMetrics& metrics, const std::vector<std::string>& selected,
                 const std::vector<RequestResult>& results) {
  nlohmann::json result = {{"date", local_timestamp("%Y%m%d-%H%M%S")},
                           {"endpoint_type", options.backend},
                           {"backend", options.backend},
                           {"label", nullptr},
                           {"model_id", options.model},
                           {"tokenizer_id", nullptr},
                           {"num_prompts", results.size()},
                           {"request_rate", std::isinf(rate) ? nlohmann::json("inf") : nlohmann::json(rate)},
                           {"burstiness", options.burstiness},
                           {"max_concurrency", max_concurrency ? nlohmann::json(*max_concurrency) : nlohmann::json()}};
  result.update(metrics_json(metrics, selected, results, options.save_detailed));
  std::string file_name = options.result_filename;
  if (file_name.empty()) {
    file_name = fmt::format("{}-{}qps{}-{}-{}.json", options.backend, python_float(rate),
                            max_concurrency ? fmt::format("-concurrency{}", *max_concurrency) : "",
                            model_base_name(options.model), local_timestamp("%Y%m%d-%H%M%S"));
  }
  const std::filesystem::path path = result_path(options, file_name);
  std::ofstream file(path);
  require(file.good(), "--save-result: cannot write {}", path.string());
  file << result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  require(file.good(), "--save-result: writing {} failed", path.string());
  spdlog::info("result written to {}", path.string());
}

void run_bench_serve(BenchServeOptions options) {
  const bool chat_backend = options.backend == "openai-chat";
  require(chat_backend || options.backend == "vllm" || options.backend == "openai",
          "--backend: '{}' is not one of vllm, openai, openai-chat", options.backend);
  if (options.endpoint.empty()) options.endpoint = chat_backend ? "/v1/chat/completions" : "/v1/completions";
  const bool chat = options.endpoint.ends_with("/chat/completions");
  require(chat == chat_backend, "--endpoint {} does not fit --backend {} (openai-chat sends /v1/chat/completions)",
          options.endpoint, options.backend);
  const std::string base_url =
      options.base_url.empty() ? fmt::format("http://{}:{}", options.host, options.port) : options.base_url;
  std::optional<std::string> api_key;
  if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr && *key != '\0') api_key = key;

  const SplitUrl url = split_url(base_url);
  const ServerEndpoint endpoint{url.base_url, url.path + options.endpoint,
                                chat ? ApiKind::ChatCompletions : ApiKind::Completions, api_key};
  if (options.model.empty()) options.model = first_served_model(base_url, api_key);
  raise_open_file_limit(kWantedOpenFiles);  // one connection per request in flight
  const std::vector<std::string> selected = parse_metric_names(options.percentile_metrics);
  const std::vector<double> percentiles = parse_percentiles(options.metric_percentiles);
  const double rate = parse_request_rate(options.request_rate);
  const std::vector<std::optional<int64_t>> levels = parse_concurrency_levels(options.max_concurrency);
  const bool sweep = levels.size() > 1;
  require(!sweep || options.result_filename.empty(),
          "--result-filename names one file; a --max-concurrency sweep writes one per level (leave it out)");

  nlohmann::json sampling = nlohmann::json::object();
  if (options.temperature) sampling["temperature"] = *options.temperature;
  if (options.top_p) sampling["top_p"] = *options.top_p;
  if (options.top_k) sampling["top_k"] = *options.top_k;

  std::vector<BenchRequest> requests;
  std::vector<BenchSession> sessions;
  if (options.dataset_name == "random") {
    RandomDatasetOptions random;
    random.num_prompts = options.num_prompts;
    random.input_len = options.random_input_len;
    random.output_len = options.random_output_len;
    random.range_ratio = options.random_range_ratio;
    random.prefix_len = options.random_prefix_len;
    std::tie(random.token_id_low, random.token_id_high) = parse_id_range(options.random_token_id_range);
    random.seed = options.seed;
    requests = random_dataset(random, endpoint.kind);
  } else if (options.dataset_name == "custom") {
    require(!options.dataset_path.empty(), "--dataset-name custom needs --dataset-path (a JSONL of {{\"prompt\": ...}})");
    requests = custom_dataset(options.dataset_path, options.num_prompts, options.custom_output_len);
  } else if (options.dataset_name == "multi-turn") {
    sessions = multi_turn_dataset(MultiTurnDatasetOptions{options.num_sessions, options.num_turns, options.random_input_len,
                                                          options.random_output_len, options.random_range_ratio,
                                                          options.seed});
  } else {
    fail("--dataset-name: '{}' is not one of random, custom, multi-turn", options.dataset_name);
  }

  // As vLLM's --lora-modules: each request (or session) names one of the adapters, drawn at random by --seed.
  std::mt19937_64 lora_draw(options.seed);
  const auto request_model = [&]() -> const std::string& {
    if (options.lora_modules.empty()) return options.model;
    return options.lora_modules[std::uniform_int_distribution<std::size_t>(0, options.lora_modules.size() - 1)(lora_draw)];
  };
  std::vector<WorkItem> items;
  for (const BenchRequest& request : requests) {
    items.push_back(single_request(endpoint, request_payload(endpoint.kind, request_model(), request, options.ignore_eos,
                                                             sampling),
                                   request.prompt_len));
  }
  for (const BenchSession& session : sessions) {
    items.push_back(multi_turn_session(endpoint, request_model(), session, options.ignore_eos, sampling));
  }

  // As vLLM does: one request first, so a wrong URL, model or payload fails at once with the server's answer. (A
  // multi-turn run sends the first session's first turn.)
  spdlog::info("Starting initial single prompt test run against {}{} (model {})...", endpoint.base_url, endpoint.path,
               options.model);
  const nlohmann::json probe_payload =
      requests.empty()
          ? request_payload(endpoint.kind, options.model,
                            BenchRequest{endpoint.kind == ApiKind::Completions
                                             ? nlohmann::json("User: " + sessions.front().user_turns.front() + "\nAssistant:")
                                             : nlohmann::json(sessions.front().user_turns.front()),
                                         0, sessions.front().output_len},
                            options.ignore_eos, sampling)
          : request_payload(endpoint.kind, options.model, requests.front(), options.ignore_eos, sampling);
  const RequestResult probe = send_streaming(endpoint, probe_payload, 0, std::chrono::steady_clock::now());
  require(probe.success, "the initial test run failed: {}", probe.error);
  spdlog::info("Initial test run completed. Starting main benchmark run: {} {}, request rate {}, max concurrency {}",
               items.size(), sessions.empty() ? "prompts" : "sessions", python_float(rate),
               options.max_concurrency.empty() ? "unlimited" : options.max_concurrency);

  std::vector<std::pair<std::string, ServeMetrics>> sweep_rows;
  for (const std::optional<int64_t>& level : levels) {
    const std::string concurrency_text = level ? std::to_string(*level) : "unlimited";
    ProgressBar bar(fmt::format("{} (concurrency {})", sessions.empty() ? "Requests" : "Sessions", concurrency_text),
                    items.size());
    const auto progress = [&bar](std::size_t done) { bar.update(done); };
    const std::optional<PrefixCacheCounters> cache_before = read_prefix_cache_counters(base_url, api_key);
    const BenchmarkRun run = run_benchmark(items, LoadShape{rate, options.burstiness, level, options.seed}, progress);
    ServeMetrics metrics = compute_metrics(run.results, run.duration, run.max_concurrent_requests, percentiles);
    metrics.prefix_cache_hit_rate = hit_rate_between(cache_before, read_prefix_cache_counters(base_url, api_key));
    std::fputs(format_summary(metrics, selected, concurrency_text, python_float(rate)).c_str(), stdout);
    std::fflush(stdout);
    for (const RequestResult& result : run.results) {
      if (!result.success) {
        spdlog::warn("first failed request: {}", result.error);
        break;
      }
    }
    sweep_rows.emplace_back(concurrency_text, metrics);
    if (options.save_result) save_result(options, rate, level, metrics, selected, run.results);
  }
  if (!sweep) return;
  const std::string table = format_sweep_table(sweep_rows);
  std::fputs(table.c_str(), stdout);
  if (options.save_result) {
    const std::filesystem::path path = result_path(options, fmt::format("{}-{}qps-sweep-{}-{}.tsv", options.backend,
                                                                        python_float(rate), model_base_name(options.model),
                                                                        local_timestamp("%Y%m%d-%H%M%S")));
    std::ofstream file(path);
    file << table;
    require(file.good(), "--save-result: writing {} failed", path.string());
    spdlog::info("sweep table written to {} (bench/plot_serve_sweep.sh draws it)", path.string());
  }
}

const CommandRegistration registration([](CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto options = std::make_shared<BenchServeOptions>();
  CLI::App* serve = bench->add_subcommand(
      "serve", "Load a running OpenAI-compatible server as `vllm bench serve` does and print its summary");
  serve->add_option("--backend", options->backend, "vllm or openai (/v1/completions), openai-chat (/v1/chat/completions)")
      ->capture_default_str();
  serve->add_option("--base-url", options->base_url, "server URL, e.g. http://127.0.0.1:8000 (default: from --host, --port)");
  serve->add_option("--host", options->host, "server host")->capture_default_str();
  serve->add_option("--port", options->port, "server port")->capture_default_str();
  serve->add_option("--endpoint", options->endpoint, "API path (default: /v1/completions, /v1/chat/completions for openai-chat)");
  serve->add_option("--model", options->model, "model name in the requests (default: the server's first /v1/models entry)");
  serve->add_option("--lora-modules", options->lora_modules,
                    "adapter names the server was started with (--lora-modules there); each request names one of "
                    "them, drawn at random (--seed), as vLLM's bench serve does");
  serve->add_option("--dataset-name", options->dataset_name, "random, custom, or multi-turn (sessions of growing conversations)")
      ->capture_default_str();
  serve->add_option("--dataset-path", options->dataset_path, "custom: a JSONL file of {\"prompt\": ...} lines");
  serve->add_option("--num-prompts", options->num_prompts, "requests to send")->capture_default_str();
  serve->add_option("--random-input-len", options->random_input_len, "random: prompt tokens")->capture_default_str();
  serve->add_option("--random-output-len", options->random_output_len, "random: max_tokens")->capture_default_str();
  serve->add_option("--random-range-ratio", options->random_range_ratio,
                    "random: lengths drawn uniformly from [len*(1-r), len*(1+r)]")->capture_default_str();
  serve->add_option("--random-prefix-len", options->random_prefix_len, "random: tokens of a prefix every prompt shares")
      ->capture_default_str();
  serve->add_option("--random-token-id-range", options->random_token_id_range,
                    "random: token ids drawn from LOW-HIGH (inside the model's vocabulary; no tokenizer here)")
      ->capture_default_str();
  serve->add_option("--custom-output-len", options->custom_output_len, "custom: max_tokens")->capture_default_str();
  serve->add_option("--num-sessions", options->num_sessions, "multi-turn: conversations (each an item of the run)")
      ->capture_default_str();
  serve->add_option("--num-turns", options->num_turns,
                    "multi-turn: requests per conversation, each resending the conversation so far plus a user turn of "
                    "--random-input-len words, answered with --random-output-len tokens")
      ->capture_default_str();
  serve->add_option("--request-rate", options->request_rate, "requests per second, or inf (all at once)")->capture_default_str();
  serve->add_option("--burstiness", options->burstiness, "gamma shape of the arrival gaps (1: Poisson)")->capture_default_str();
  serve->add_option("--max-concurrency", options->max_concurrency,
                    "requests in flight at most (default: unlimited); a comma-separated list runs the benchmark at each "
                    "level (a sweep) and prints a table of them");
  serve->add_option("--seed", options->seed, "seed of the dataset and the arrivals")->capture_default_str();
  serve->add_flag("--ignore-eos", options->ignore_eos, "send ignore_eos: every request generates its max_tokens");
  serve->add_option("--temperature", options->temperature, "sampling temperature (default 0: greedy)");
  serve->add_option("--top-p", options->top_p, "top_p sent with each request");
  serve->add_option("--top-k", options->top_k, "top_k sent with each request");
  serve->add_option("--percentile-metrics", options->percentile_metrics, "comma-separated: ttft, tpot, itl, e2el")
      ->capture_default_str();
  serve->add_option("--metric-percentiles", options->metric_percentiles, "comma-separated percentiles, e.g. 50,90,99")
      ->capture_default_str();
  serve->add_flag("--save-result", options->save_result, "write the result JSON");
  serve->add_flag("--save-detailed", options->save_detailed,
                  "with --save-result: add per-request input_lens, output_lens, ttfts, itls, generated_texts, errors");
  serve->add_option("--result-dir", options->result_dir, "folder of the result JSON (default: the working directory)");
  serve->add_option("--result-filename", options->result_filename,
                    "file name (default: {backend}-{rate}qps[-concurrency{N}]-{model}-{date}.json)");
  serve->footer("Environment: OPENAI_API_KEY is sent as the bearer token when set.");
  serve->callback([options] { run_bench_serve(*options); });
});

}  // namespace
}  // namespace beamline::cli
