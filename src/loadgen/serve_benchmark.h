#pragma once
// Sends a dataset's requests to a server as `vllm bench serve` does: arrivals all at once (--request-rate inf) or
// with gamma-distributed gaps (shape --burstiness, 1 = a Poisson process) at --request-rate per second, at most
// --max-concurrency in flight (a request that arrives while all are busy waits for one to finish; its timings
// start when it is sent).
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

struct BenchmarkRun {
  std::vector<RequestResult> results;  // in dataset order
  double duration = 0;                 // seconds from the first arrival to the last answer
  int64_t max_concurrent_requests = 0;
};

// `payloads[i]` is the request body for dataset entry i, `prompt_lens[i]` its length as the dataset drew it.
// `on_done` (may be empty) is called from the sending threads after each request, with the count done so far.
BenchmarkRun run_benchmark(const ServerEndpoint& endpoint, const std::vector<nlohmann::json>& payloads,
                           const std::vector<int64_t>& prompt_lens, const LoadShape& shape,
                           const std::function<void(std::size_t)>& on_done);

}  // namespace beamline::loadgen
