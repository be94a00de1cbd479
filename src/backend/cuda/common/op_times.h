#pragma once
// Device time per op of the CUDA backend (internal to backend/cuda), for BEAMLINE_CUDA_OP_TIMES=1: an event pair
// around each op on the stream, read when the host waits anyway (download, synchronize) or when many are pending.
// The table goes to the log when the backend closes, with the device's idle time between consecutive ops (launch
// gaps and host work inside a step; long pauses are not counted). Ops recorded into graphs are not timed: run with
// --enforce-eager to see each op of a decode step.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace beamline::cuda {

class OpTimes {
 public:
  explicit OpTimes(cudaStream_t stream) : stream_(stream) {}
  ~OpTimes();
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;

  // Times `op` from construction to destruction; an op called inside another is part of the outer one.
  class Scope {
   public:
    Scope(OpTimes* times, const char* op);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpTimes* times_;
    bool outer_ = false;  // not inside another timed op
    std::size_t index_ = 0;
  };

  // Reads every pending pair; the stream's work so far must be done (the host has just waited for it).
  void resolve();
  // The Markdown table of what was timed, longest total first.
  std::string table();

 private:
  struct Pending {
    const char* op;
    cudaEvent_t start, end;
  };
  struct Total {
    int64_t calls = 0;
    double ms = 0.0;
  };
  static constexpr std::size_t kMaxPending = 4096;
  cudaEvent_t take_event();

  cudaStream_t stream_;
  int depth_ = 0;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
  std::map<std::string, Total> totals_;
  // The device idle between one op's end and the next one's start: launch gaps and host work when shorter than this,
  // a pause (no work, a wait for requests) when longer.
  static constexpr float kLongestLaunchGapMs = 1.0f;
  double gaps_ms_ = 0.0;
  int64_t pauses_ = 0;
};

}  // namespace beamline::cuda
