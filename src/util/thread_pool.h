#pragma once
// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace beamline {

class ThreadPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const { return workers_.size() + 1; }

  // Calls body(begin, end) over disjoint chunks covering [0, count), on the pool and the calling
  // thread, and returns when all chunks are done. Chunks hold at least min_chunk items.
  // The first exception thrown by a chunk is rethrown here.
  void parallel_for(std::size_t count, const std::function<void(std::size_t, std::size_t)>& body,
                    std::size_t min_chunk = 1);

  // The process-wide pool (sized by BEAMLINE_NUM_THREADS or the hardware).
  static ThreadPool& global();

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::mutex call_mutex_;  // one parallel_for at a time
  const std::function<void(std::size_t, std::size_t)>* body_ = nullptr;
  std::size_t count_ = 0, chunk_ = 0, next_ = 0, pending_ = 0;
  std::size_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace beamline
