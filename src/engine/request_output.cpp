#include "engine/request_output.h"

#include <algorithm>

namespace beamline {

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "error";
}

void merge_output(RequestOutput& earlier, RequestOutput&& later) {
  for (SampleOutput& sample : later.samples) {
    auto it = std::find_if(earlier.samples.begin(), earlier.samples.end(),
                           [&](const SampleOutput& s) { return s.index == sample.index; });
    if (it == earlier.samples.end()) {
      earlier.samples.push_back(std::move(sample));
      continue;
    }
    it->token_ids.insert(it->token_ids.end(), sample.token_ids.begin(), sample.token_ids.end());
    it->text += sample.text;
    std::move(sample.logprobs.begin(), sample.logprobs.end(), std::back_inserter(it->logprobs));
    it->routed_experts.insert(it->routed_experts.end(), sample.routed_experts.begin(), sample.routed_experts.end());
    if (!sample.prompt_logprobs.empty()) it->prompt_logprobs = std::move(sample.prompt_logprobs);
    if (sample.finish_reason) {
      it->finish_reason = sample.finish_reason;
      it->stop_reason = std::move(sample.stop_reason);
    }
  }
  std::sort(earlier.samples.begin(), earlier.samples.end(),
            [](const SampleOutput& a, const SampleOutput& b) { return a.index < b.index; });
  earlier.finished = later.finished;
  earlier.usage = later.usage;
  if (later.error) earlier.error = std::move(later.error);
  if (later.finished) earlier.metrics = later.metrics;
}

void OutputStream::push(RequestOutput output) {
  std::function<void(bool)> callback;
  bool finished = false;
  {
    std::lock_guard lock(mutex_);
    final_pushed_ = final_pushed_ || output.finished;
    pending_.push_back(std::move(output));
    finished = final_pushed_;
    callback = finished ? std::move(on_ready_) : on_ready_;
    if (finished) on_ready_ = nullptr;
  }
  ready_.notify_all();
  if (callback) callback(finished);
}

void OutputStream::on_ready(std::function<void(bool finished)> callback) {
  bool waiting = false;
  bool finished = false;
  {
    std::lock_guard lock(mutex_);
    waiting = !pending_.empty();
    finished = final_pushed_;
    if (!finished) on_ready_ = callback;
  }
  if (waiting && callback) callback(finished);
}

std::optional<RequestOutput> OutputStream::take_locked() {
  if (pending_.empty()) return std::nullopt;
  RequestOutput merged = std::move(pending_.front());
  pending_.pop_front();
  while (!pending_.empty()) {
    merge_output(merged, std::move(pending_.front()));
    pending_.pop_front();
  }
  if (merged.finished) done_ = true;
  return merged;
}

std::optional<RequestOutput> OutputStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (done_) return std::nullopt;
  ready_.wait_for(lock, timeout, [&] { return !pending_.empty(); });
  return take_locked();
}

std::optional<RequestOutput> OutputStream::next() {
  std::unique_lock lock(mutex_);
  if (done_) return std::nullopt;
  ready_.wait(lock, [&] { return !pending_.empty(); });
  return take_locked();
}

bool OutputStream::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

}  // namespace beamline
