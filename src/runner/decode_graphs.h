#pragma once
// Decode steps as recorded op graphs (CUDA graphs; vLLM's default, off with --enforce-eager). A step of one-token
// sequences (or of sequences with the same number of rows each, every row a logit row: speculative decoding's verify
// steps, 1 + k rows per sequence, where the backend's attention plan can be recorded) is padded to a batch-size
// bucket (with padding sequences of as many rows as its own) and its block tables to a power-of-two width; the first
// step of each (bucket, rows per sequence, widths, attention plans) runs op by op and records the forward pass once,
// every later one copies its
// inputs into the recorded buffers in a single upload and replays it, without the host's per-op work and launch gaps.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/beam_model.h"
#include "runner/kv_cache.h"

namespace beamline {

class DecodeGraphs {
 public:
  // Buckets up to max_batch (at most kMaxBucket) sequences. The model and cache must outlive this object. With
  // `capture_routed_experts` every graph's router also writes its expert ids into a buffer of the graph's
  // (BeamModel::forward's routed_experts), for the steps that want them.
  DecodeGraphs(BeamModel& model, KvCache& cache, int32_t max_batch, bool capture_routed_experts = false);

  static constexpr int32_t kMaxBucket = 512;
  // Graphs kept at once; the least recently used goes first (each holds its step's activations).
  static constexpr std::size_t kMaxGraphs = 48;

  // The logits of a validated batch when it can replay a graph (every sequence has the same number of rows, logits of
  // all of them in order, at most max_batch sequences, an attention plan a graph can hold); nullopt otherwise.
  // `token_source`: what batch.deferred_tokens read (BeamModel::forward). With capture_routed_experts and
  // batch.capture_routed_experts, `routed_experts` gets the step's expert ids: I32 [moe_layers, bucket, top_k], the
  // batch's rows first. When the model captures hidden states for a drafter (BeamModel::capture_hidden_after),
  // `captured_hidden` gets the step's: F32 [layers, bucket, hidden], the batch's rows first.
  std::optional<Tensor> forward(const ForwardBatch& batch, const Tensor& token_source = {},
                                Tensor* routed_experts = nullptr, Tensor* captured_hidden = nullptr);

  // Steps that recorded a graph / replayed one, for logs and tests.
  int64_t recorded() const { return recorded_; }
  int64_t replayed() const { return replayed_; }

 private:
  struct Graph {
    BeamModel::StepInputs inputs;  // the buffers the graph reads
    Tensor logits;                 // and the one it writes
    Tensor routed_experts;         // and the router's choices (capture_routed_experts)
    Tensor captured_hidden;        // and the hidden states a drafter reads (BeamModel::capture_hidden_after)
    std::unique_ptr<OpGraph> graph;
    int64_t last_used = 0;
  };

  std::optional<std::string> key(const BeamModel::StepInputs& inputs) const;
  int32_t bucket(int32_t sequences) const;

  BeamModel& model_;
  KvCache& cache_;
  bool capture_routed_experts_;
  std::vector<int32_t> buckets_;
  std::map<std::string, Graph> graphs_;
  int64_t steps_ = 0, recorded_ = 0, replayed_ = 0;
};

}  // namespace beamline
