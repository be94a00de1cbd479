#pragma once
// Counters and histograms for /metrics, snapshotted from the engine thread.
#include <cstdint>
#include <vector>

namespace beamline {

struct Histogram {
  std::vector<double> bounds;      // upper bounds of the buckets, ascending (+Inf is implicit)
  std::vector<uint64_t> counts;    // per bucket, not cumulative; one more than bounds (the +Inf bucket)
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> upper_bounds = {});
  void observe(double value);
};

// Bucket bounds in seconds (vLLM's for the same metrics).
std::vector<double> time_to_first_token_buckets();
std::vector<double> inter_token_latency_buckets();
std::vector<double> request_latency_buckets();

struct EngineStats {
  int32_t num_running = 0;                 // sequences in the running set
  int32_t num_waiting = 0;                 // sequences waiting (new or preempted)
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;              // including cached-but-unreferenced blocks
  double kv_cache_usage = 0;               // fraction of blocks referenced
  int64_t kv_cache_bytes = 0;
  int64_t kv_token_capacity = 0;           // positions of full-attention KV the pool holds
  uint64_t prefix_cache_queries_total = 0; // tokens
  uint64_t prefix_cache_hits_total = 0;    // tokens
  uint64_t prompt_tokens_total = 0;
  uint64_t generation_tokens_total = 0;
  uint64_t requests_finished_total = 0;
  uint64_t requests_stopped = 0, requests_length = 0, requests_aborted = 0, requests_failed = 0;
  uint64_t preemptions_total = 0;
  uint64_t steps_total = 0;
  int64_t kv_hybrid_saved_bytes = 0;       // now, over running sequences, against keeping every layer's KV
  uint64_t kv_hybrid_saved_bytes_finished_total = 0;  // summed over finished sequences at their end
  // Speculative decoding (vLLM's spec_decode counters): drafts verified (one per sequence and step that had one),
  // their tokens, the accepted ones (not counting the target's own token after them), and accepted by position.
  uint64_t spec_decode_num_drafts_total = 0;
  uint64_t spec_decode_num_draft_tokens_total = 0;
  uint64_t spec_decode_num_accepted_tokens_total = 0;
  std::vector<uint64_t> spec_decode_num_accepted_tokens_per_pos;  // [position in the draft]
  // Jump-forward (structured outputs): tokens of grammar-forced drafts, and those the target's rows confirmed.
  uint64_t jump_forward_draft_tokens_total = 0;
  uint64_t jump_forward_accepted_tokens_total = 0;
  Histogram time_to_first_token{time_to_first_token_buckets()};
  Histogram inter_token_latency{inter_token_latency_buckets()};
  Histogram e2e_request_latency{request_latency_buckets()};
  Histogram request_queue_time{request_latency_buckets()};
};

}  // namespace beamline
