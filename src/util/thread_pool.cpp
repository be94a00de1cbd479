#include "util/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

namespace beamline {
namespace {
// A parallel_for issued from inside a chunk runs serially on that thread instead of deadlocking.
thread_local bool inside_pool_chunk = false;
}  // namespace

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* env = std::getenv("BEAMLINE_NUM_THREADS");
    return env ? static_cast<std::size_t>(std::max(1, std::atoi(env))) : std::size_t{0};
  }());
  return pool;
}

void ThreadPool::run_chunks() {
  for (;;) {
    std::size_t begin;
    {
      std::lock_guard lock(mutex_);
      if (next_ >= count_) return;
      begin = next_;
      next_ = std::min(count_, next_ + chunk_);
    }
    const std::size_t end = std::min(count_, begin + chunk_);
    try {
      inside_pool_chunk = true;
      (*body_)(begin, end);
      inside_pool_chunk = false;
    } catch (...) {
      inside_pool_chunk = false;
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    if (--pending_ == 0) done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  std::size_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
  }
}

void ThreadPool::parallel_for(std::size_t count, const std::function<void(std::size_t, std::size_t)>& body,
                              std::size_t min_chunk) {
  if (count == 0) return;
  const std::size_t threads = size();
  std::size_t chunk = std::max<std::size_t>(min_chunk, (count + threads * 4 - 1) / (threads * 4));
  if (threads == 1 || chunk >= count || inside_pool_chunk) {
    body(0, count);
    return;
  }
  std::lock_guard call(call_mutex_);
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    count_ = count;
    chunk_ = chunk;
    next_ = 0;
    pending_ = (count + chunk - 1) / chunk;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_chunks();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  body_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace beamline
