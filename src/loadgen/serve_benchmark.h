#pragma once
// Sends a dataset's work to a server as `vllm bench serve` does: arrivals all at once (--request-rate inf) or
// with gamma-distributed gaps (shape --burstiness, 1 = a Poisson process) at --request-rate per second, at most
// --max-concurrency in flight (an item that arrives while all are busy waits for one to finish; its timings
// start when it is sent). An item is one request, or a multi-turn session whose turns go one after another.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "loadgen/openai_stream_client.h"
#include "loadgen/request_result.h"

namespace beamline::loadgen {

struct LoadShape {
  double request_rate = 0;  // requests per second; infinity: all at once
  double burstiness = 1.0;
  std::optional<int64_t> max_concurrency;
  uint64_t seed = 0;
};

// Sends one item's requests (their timings relative to `benchmark_start`) and returns their results in order.
using WorkItem = std::function<std::vector<RequestResult>(std::chrono::steady_clock::time_point benchmark_start)>;

struct BenchmarkRun {
  std::vector<RequestResult> results;  // in dataset order (a session's turns in turn order)
  double duration = 0;                 // seconds from the first arrival to the last answer
  int64_t max_concurrent_requests = 0;
};

// `on_done` (may be empty) is called from the sending threads after each item, with the count done so far.
BenchmarkRun run_benchmark(const std::vector<WorkItem>& items, const LoadShape& shape,
                           const std::function<void(std::size_t)>& on_done);

// A work item of one streamed request.
WorkItem single_request(ServerEndpoint endpoint, nlohmann::json payload, int64_t dataset_prompt_len);

}  // namespace beamline::loadgen
