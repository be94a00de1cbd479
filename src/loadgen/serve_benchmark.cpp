#include "loadgen/serve_benchmark.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "util/error.h"

namespace beamline::loadgen {

namespace {

using Clock = std::chrono::steady_clock;

// Indices of arrived requests, handed to the sending threads.
class ArrivalQueue {
 public:
  void push(std::size_t index) {
    {
      std::lock_guard lock(mutex_);
      arrived_.push_back(index);
    }
    changed_.notify_one();
  }
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
  }
  // The next arrived request, or nullopt once closed and drained.
  std::optional<std::size_t> pop() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || !arrived_.empty(); });
    if (arrived_.empty()) return std::nullopt;
    const std::size_t index = arrived_.front();
    arrived_.pop_front();
    return index;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::size_t> arrived_;
  bool closed_ = false;
};

}  // namespace

WorkItem single_request(ServerEndpoint endpoint, nlohmann::json payload, int64_t dataset_prompt_len) {
  return [endpoint = std::move(endpoint), payload = std::move(payload), dataset_prompt_len](Clock::time_point start) {
    return std::vector<RequestResult>{send_streaming(endpoint, payload, dataset_prompt_len, start)};
  };
}

BenchmarkRun run_benchmark(const std::vector<WorkItem>& items, const LoadShape& shape,
                           const std::function<void(std::size_t)>& on_done) {
  require(shape.request_rate > 0, "--request-rate must be positive or inf (got {})", shape.request_rate);
  require(shape.burstiness > 0, "--burstiness must be positive (got {})", shape.burstiness);
  require(!shape.max_concurrency || *shape.max_concurrency >= 1, "--max-concurrency must be at least 1");
  BenchmarkRun run;
  std::vector<std::vector<RequestResult>> results(items.size());
  // One sending thread per item that may be in flight at once: --max-concurrency bounds the threads too.
  const std::size_t senders =
      shape.max_concurrency ? std::min<std::size_t>(static_cast<std::size_t>(*shape.max_concurrency), items.size())
                            : items.size();
  ArrivalQueue queue;
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> peak{0};
  std::atomic<std::size_t> done{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(senders);
  for (std::size_t t = 0; t < senders; ++t) {
    threads.emplace_back([&] {
      while (std::optional<std::size_t> index = queue.pop()) {
        const int64_t now_in_flight = ++in_flight;
        for (int64_t seen = peak.load(); now_in_flight > seen && !peak.compare_exchange_weak(seen, now_in_flight);) {
        }
        results[*index] = items[*index](start);
        --in_flight;
        const std::size_t finished = ++done;
        if (on_done) on_done(finished);
      }
    });
  }
  std::mt19937_64 random(shape.seed);
  const bool paced = std::isfinite(shape.request_rate);
  // Gaps with mean 1 / rate; the shape sets how bursty they are (its scale would be 0 at an infinite rate).
  std::gamma_distribution<double> gap(shape.burstiness, paced ? 1.0 / (shape.request_rate * shape.burstiness) : 1.0);
  Clock::time_point next = start;
  for (std::size_t i = 0; i < items.size(); ++i) {
    std::this_thread::sleep_until(next);
    queue.push(i);
    if (paced) next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(random)));
  }
  queue.close();
  for (std::thread& thread : threads) thread.join();
  run.duration = std::chrono::duration<double>(Clock::now() - start).count();
  for (std::vector<RequestResult>& item_results : results) {
    for (RequestResult& result : item_results) run.results.push_back(std::move(result));
  }
  run.max_concurrent_requests = peak.load();
  return run;
}

}  // namespace beamline::loadgen
