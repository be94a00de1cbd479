#pragma once
// What the engine needs from a model: one batched forward step over the paged KV cache the runner owns.
// BeamModelRunner (beam_model_runner.h) wires BeamModel in; tests use deterministic fakes.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/forward_batch.h"

namespace beamline {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int32_t vocab_size() const = 0;
  // The layout of the KV pool the runner allocated (num_blocks set): the engine's allocator hands out
  // exactly these blocks.
  virtual const KvCacheLayout& kv_layout() const = 0;
  virtual int32_t sliding_window() const = 0;      // of the layout's sliding groups; 0 when there are none
  virtual int64_t max_position_embeddings() const = 0;
  virtual int64_t kv_bytes_per_block() const = 0;  // all slots of one pool block, K and V

  // Writes the K/V of every token of `batch` and returns the logits of batch.logit_rows, F32
  // [logit_rows.size(), vocab_size()] on backend(), after the final soft-capping (undefined when there are no
  // logit rows). They stay there: the engine samples them with Backend::sample.
  virtual Tensor forward(const ForwardBatch& batch) = 0;
  virtual Backend& backend() = 0;
};

}  // namespace beamline
