#include "backend/cuda/common/op_times.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda/common/device_memory.h"

namespace beamline::cuda {

OpTimes::~OpTimes() {
  for (const Pending& pending : pending_) {
    cudaEventDestroy(pending.start);
    cudaEventDestroy(pending.end);
  }
  for (cudaEvent_t event : spare_) cudaEventDestroy(event);
}

cudaEvent_t OpTimes::take_event() {
  if (!spare_.empty()) {
    cudaEvent_t event = spare_.back();
    spare_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  BEAMLINE_CUDA_CHECK(cudaEventCreate(&event));
  return event;
}

OpTimes::Scope::Scope(OpTimes* times, const char* op) : times_(times) {
  if (times_ == nullptr) return;
  if (times_->depth_ > 0) {  // inside another op: counted there
    ++times_->depth_;
    return;
  }
  if (times_->pending_.size() >= kMaxPending) {
    BEAMLINE_CUDA_CHECK(cudaEventSynchronize(times_->pending_.back().end));
    times_->resolve();
  }
  ++times_->depth_;
  outer_ = true;
  const Pending pending{op, times_->take_event(), times_->take_event()};
  BEAMLINE_CUDA_CHECK(cudaEventRecord(pending.start, times_->stream_));
  index_ = times_->pending_.size();
  times_->pending_.push_back(pending);
}

OpTimes::Scope::~Scope() {
  if (times_ == nullptr) return;
  --times_->depth_;
  if (outer_) cudaEventRecord(times_->pending_[index_].end, times_->stream_);
}

void OpTimes::resolve() {
  if (pending_.empty() || depth_ > 0) return;
  for (std::size_t i = 1; i < pending_.size(); ++i) {
    float gap = 0.0f;
    if (cudaEventElapsedTime(&gap, pending_[i - 1].end, pending_[i].start) != cudaSuccess) continue;
    if (gap < kLongestLaunchGapMs) {
      gaps_ms_ += gap;
    } else {
      ++pauses_;
    }
  }
  for (const Pending& pending : pending_) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, pending.start, pending.end) == cudaSuccess) {
      Total& total = totals_[pending.op];
      ++total.calls;
      total.ms += ms;
    }
    spare_.push_back(pending.start);
    spare_.push_back(pending.end);
  }
  pending_.clear();
}

std::string OpTimes::table() {
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double busy = 0.0;
  for (const auto& [op, total] : rows) busy += total.ms;
  std::string text = fmt::format(
      "device time per op: ops {:.2f} ms; gaps shorter than {} ms between consecutive ops (launches, host work inside "
      "a step) {:.2f} ms, {:.1f}% of ops + gaps; {} longer pauses (idle, waits for requests) not counted\n"
      "| op | calls | total ms | mean us | share of op time |\n| --- | --- | --- | --- | --- |\n",
      busy, kLongestLaunchGapMs, gaps_ms_, busy + gaps_ms_ > 0 ? 100.0 * gaps_ms_ / (busy + gaps_ms_) : 0.0, pauses_);
  for (const auto& [op, total] : rows)
    text += fmt::format("| {} | {} | {:.3f} | {:.1f} | {:.1f}% |\n", op, total.calls, total.ms,
                        1e3 * total.ms / static_cast<double>(total.calls), busy > 0 ? 100.0 * total.ms / busy : 0.0);
  return text;
}

}  // namespace beamline::cuda
