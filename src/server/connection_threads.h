#pragma once
// The threads that serve HTTP connections (httplib's TaskQueue): one per connection being served, as httplib's own
// pool, but started when a connection finds no idle thread and ended after kIdleExit without one, so an idle server
// holds a handful of threads instead of --http-threads of them, and the bound can be set as high as the clients a
// server must hold at once (a streaming response keeps its thread to the end). At the bound, accepted connections
// wait, first come first served, for a thread to free.
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace beamline::server {

class ConnectionThreads : public httplib::TaskQueue {
 public:
  static constexpr std::chrono::seconds kIdleExit{10};

  explicit ConnectionThreads(std::size_t max_threads, std::chrono::milliseconds idle_exit = kIdleExit);
  ~ConnectionThreads() override;
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  void enqueue(std::function<void()> job) override;
  // Runs the jobs already queued, then ends every thread (httplib calls it when listening stops).
  void shutdown() override;

  std::size_t threads() const;  // alive now

 private:
  void work(std::list<std::thread>::iterator self);
  void join_exited_locked(std::unique_lock<std::mutex>& lock);

  const std::size_t max_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mutex_;
  std::condition_variable job_ready_;
  std::condition_variable thread_exited_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;                       // alive or exited but not yet joined
  std::vector<std::list<std::thread>::iterator> exited_;  // to join (by the next enqueue or shutdown)
  std::size_t idle_ = 0;
  bool shutting_down_ = false;
};

}  // namespace beamline::server
