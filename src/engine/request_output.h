#pragma once
// What the engine thread hands back for one request: a stream of events, read by the HTTP thread.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "sampling/sampling.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

enum class FinishReason { Stop, Length, Abort, Error };
std::string_view to_string(FinishReason reason);  // "stop", "length", "abort", "error"

// Progress of one of the n samples since the previous event.
struct SampleOutput {
  int32_t index = 0;
  std::vector<TokenId> token_ids;
  std::string text;                                // new text; stop strings (and text that may still turn
                                                   // into one) are held back
  // One per new token, when the request asked: the raw log-softmax of the soft-capped logits (before penalties,
  // bias, temperature and truncation), sampling/sampling.h.
  std::vector<TokenLogprob> logprobs;
  // Routing replay (GenerationRequest::return_routed_experts): the expert ids of the positions computed since the
  // previous event, [positions, moe_layers, top_k] flattened, in position order from 0. Over a whole sample they
  // cover every prompt and output token but the last output token, which no step computes.
  std::vector<int16_t> routed_experts;
  // prompt_logprobs (vLLM's): with the sample's first token, one entry per prompt token, in --logprobs-mode, the first
  // empty (nothing predicts it).
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  std::optional<FinishReason> finish_reason;       // set once, on the sample's last event
  std::variant<std::monostate, TokenId, std::string> stop_reason;  // the stop token id or stop string met
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;                   // over all samples
  int32_t cached_tokens = 0;                       // prompt tokens served from the prefix cache
};

struct RequestMetrics {
  double queue_seconds = 0;                        // arrival to first scheduled
  double time_to_first_token_seconds = 0;
  double e2e_seconds = 0;
  int32_t preemptions = 0;
  int64_t kv_hybrid_saved_bytes = 0;               // at the end, against keeping every layer's KV (summed over samples)
};

struct RequestOutput {
  std::string request_id;
  std::vector<SampleOutput> samples;               // the samples that progressed, by index
  bool finished = false;                           // every sample is done: the stream's last event
  Usage usage;
  std::optional<std::string> error;                // what failed, with FinishReason::Error
  RequestMetrics metrics;                          // filled on the last event
};

// Single producer (the engine thread), single consumer: a thread that waits in next(), or an event loop told by the
// on_ready callback that next(0) has something.
class OutputStream {
 public:
  explicit OutputStream(std::string request_id) : request_id_(std::move(request_id)) {}
  const std::string& request_id() const { return request_id_; }

  // Everything that arrived since the last call, merged into one event (a slow reader gets larger
  // deltas, never lost ones). Waits up to `timeout`; nullopt on timeout and after the final event.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  std::optional<RequestOutput> next();  // waits until something arrives or the stream is done
  bool done() const;                    // the final event was taken

  // Called, on the pushing thread and without the stream's lock, after every push (and at once when events already
  // wait), with whether the final event is among those pushed; it must be quick (hand the work to another thread).
  // Dropped after the final event is pushed, so what it holds is released once the request ends.
  void on_ready(std::function<void(bool finished)> callback);

  void push(RequestOutput output);      // engine side

 private:
  std::optional<RequestOutput> take_locked();

  const std::string request_id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> pending_;
  bool done_ = false;
  bool final_pushed_ = false;
  std::function<void(bool finished)> on_ready_;
};

// Merges `later` into `earlier` (concatenating tokens, text and logprobs per sample index).
void merge_output(RequestOutput& earlier, RequestOutput&& later);

}  // namespace beamline
