#pragma once
// Paged KV storage for a KvCacheLayout (forward_batch.h), the standard hybrid layout of a config, and a
// minimal block allocator for a single sequence (the `logits` and `generate` commands; the serving engine
// has its own allocator over the same layout).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/beam_model.h"
#include "model/config.h"
#include "model/forward_batch.h"

namespace beamline {

// The largest of 16, 8, 4, 2, 1 that divides sliding_window (16 when the model has no sliding layer).
int32_t default_block_size(const ModelConfig& config);

// Groups: the full-attention layers first, then the sliding layers, in groups of at most slots_per_block
// layers each, where slots_per_block = the number of full layers (at least 1). block_size must divide
// sliding_window when the model has sliding layers.
KvCacheLayout make_kv_cache_layout(const ModelConfig& config, int32_t block_size, int32_t num_blocks);

// Pool blocks that one sequence of up to max_len positions needs when no step feeds more than max_step
// tokens: every position for full groups, the window plus one step (block-rounded) for sliding groups.
int32_t single_sequence_blocks(const KvCacheLayout& layout, const ModelConfig& config, int64_t max_len,
                               int64_t max_step);

// The KV memory one sequence of `tokens` positions holds (docs/long-context.md): only the full-attention layers
// keep every position; a sliding layer keeps its window. Both as bytes of K and V (the floor) and as the pool blocks
// the KV cache manager holds for the sequence while it decodes its next token (blocks rounded up, sliding groups
// holding the blocks that intersect the window of position `tokens`), which is what the serving engine's
// vllm:kv_cache_usage_perc counts.
struct KvMemoryPrediction {
  int64_t full_layers = 0, sliding_layers = 0;
  int64_t bytes_per_token = 0;  // K and V of one position in every full-attention layer
  int64_t sliding_bytes = 0;    // K and V of min(tokens, sliding_window) positions in every sliding layer
  int64_t bytes = 0;            // bytes_per_token * tokens + sliding_bytes
  int64_t block_bytes = 0;      // one pool block (every slot of it, K and V)
  int64_t full_blocks = 0, sliding_blocks = 0;  // held by the full-attention groups / by the sliding groups
  int64_t held_bytes() const { return (full_blocks + sliding_blocks) * block_bytes; }
};
KvMemoryPrediction predict_kv_memory(const ModelConfig& config, const KvCacheLayout& layout, DType kv_dtype,
                                     int64_t tokens);

class KvCache {
 public:
  // Allocates K and V [num_blocks, slots_per_block, block_size, num_kv_heads, head_dim] on the backend.
  KvCache(Backend& backend, const ModelConfig& config, KvCacheLayout layout, DType dtype = DType::F32);

  const KvCacheLayout& layout() const { return layout_; }
  PagedKvPool& pool() { return pool_; }
  DType dtype() const { return pool_.k.dtype(); }
  std::size_t bytes() const { return pool_.k.nbytes() + pool_.v.nbytes(); }
  operator KvCacheView() { return {layout_, pool_}; }  // what BeamModel reads and writes

 private:
  KvCacheLayout layout_;
  PagedKvPool pool_;
};

// Block tables of one sequence over the whole pool. Sliding groups give back (kNullBlock) every block that
// lies entirely before the window of the step's first query, so between steps they hold only the window.
class SingleSequenceBlocks {
 public:
  SingleSequenceBlocks(const KvCacheLayout& layout, int64_t sliding_window);

  // Block tables for a step whose new tokens occupy positions [query_begin, end): grows them to cover
  // [0, end) and first releases what no query at >= query_begin can see. Throws when the pool is too small.
  const std::vector<std::vector<int32_t>>& prepare(int64_t query_begin, int64_t end);

  int32_t blocks_in_use() const { return layout_.num_blocks - static_cast<int32_t>(free_.size()); }

 private:
  KvCacheLayout layout_;
  int64_t sliding_window_;
  std::vector<int32_t> free_;
  std::vector<std::vector<int32_t>> tables_;
};

}  // namespace beamline
