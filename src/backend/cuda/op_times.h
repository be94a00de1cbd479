#pragma once
// Device time per op of the CUDA backend (internal to backend/cuda), for BEAMLINE_CUDA_OP_TIMES=1: an event pair
// around each op on the stream, read when the host waits anyway (download, synchronize) or when many are pending.
// The table goes to the log when the backend closes, with the share of the device timeline the ops cover between
// those waits (the rest is launch gaps and host work). Ops recorded into graphs are not timed: run with
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
  double timeline_ms_ = 0.0;  // from the first op's start to the last op's end, summed over the waits
};

}  // namespace beamline::cuda
