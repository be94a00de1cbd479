#include "server/connection_threads.h"

#include "util/error.h"

namespace beamline::server {

ConnectionThreads::ConnectionThreads(std::size_t max_threads, std::chrono::milliseconds idle_exit)
    : max_threads_(max_threads), idle_exit_(idle_exit) {
  require(max_threads >= 1, "--http-threads must be at least 1");
}

ConnectionThreads::~ConnectionThreads() { shutdown(); }

void ConnectionThreads::enqueue(std::function<void()> job) {
  std::unique_lock lock(mutex_);
  join_exited_locked(lock);
  jobs_.push_back(std::move(job));
  // Every idle thread may already be promised to an earlier job: start one when the queue outgrows them.
  const std::size_t alive = threads_.size() - exited_.size();
  if (jobs_.size() > idle_ && alive < max_threads_) {
    threads_.emplace_back();
    const auto self = std::prev(threads_.end());
    *self = std::thread([this, self] { work(self); });
  } else {
    job_ready_.notify_one();
  }
}

void ConnectionThreads::work(std::list<std::thread>::iterator self) {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    const bool woken = job_ready_.wait_for(lock, idle_exit_, [&] { return !jobs_.empty() || shutting_down_; });
    --idle_;
    if (!woken || jobs_.empty()) break;  // idle too long, or shutting down with nothing left to run
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
  exited_.push_back(self);
  thread_exited_.notify_all();
}

void ConnectionThreads::join_exited_locked(std::unique_lock<std::mutex>& lock) {
  std::vector<std::list<std::thread>::iterator> exited;
  exited.swap(exited_);
  std::list<std::thread> joining;
  for (const auto& thread : exited) joining.splice(joining.end(), threads_, thread);
  // The exited threads only have their last unlock to run: join them without the lock.
  lock.unlock();
  for (std::thread& thread : joining) thread.join();
  lock.lock();
}

void ConnectionThreads::shutdown() {
  std::unique_lock lock(mutex_);
  shutting_down_ = true;
  job_ready_.notify_all();
  thread_exited_.wait(lock, [&] { return exited_.size() == threads_.size(); });
  join_exited_locked(lock);
}

std::size_t ConnectionThreads::threads() const {
  std::lock_guard lock(mutex_);
  return threads_.size() - exited_.size();
}

}  // namespace beamline::server
