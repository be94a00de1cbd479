#pragma once
// What one forward step computes: a flattened (varlen) batch of tokens from several sequences, with the
// paged-KV block tables that say where each sequence's keys and values live. The engine builds it; the
// model runs it on any backend. Never padded.
#include <cstdint>
#include <vector>

#include "backend/tensor.h"

namespace beamline {

// How the paged KV pool maps onto layers (vLLM's hybrid layout).
// The layers are split into KV groups of at most `slots_per_block` layers each: the full-attention layers
// form the first group(s), the sliding layers the following ones. A pool block holds `block_size` token
// positions for each of `slots_per_block` layer slots; layer l stores its K/V in slot layer_slot[l] of the
// blocks listed in its group's block table. Every group has its own block table per sequence.
struct KvCacheLayout {
  int32_t block_size = 16;                 // tokens per block; divides sliding_window
  int32_t num_blocks = 0;                  // blocks in the pool
  int32_t slots_per_block = 1;             // layers sharing one block
  std::vector<int32_t> layer_group;        // [num_layers] -> KV group
  std::vector<int32_t> layer_slot;         // [num_layers] -> slot inside a block
  std::vector<bool> group_is_sliding;      // [num_groups]
  int32_t num_groups() const { return static_cast<int32_t>(group_is_sliding.size()); }
};

inline constexpr int32_t kNullBlock = -1;  // a block a sliding group has given back (left the window)

struct SequenceSlice {
  int32_t token_begin = 0;   // rows [token_begin, token_end) of ForwardBatch::tokens
  int32_t token_end = 0;
  int32_t context_begin = 0; // absolute position of the first new token = tokens already in the KV cache
  // block_tables[group][i] = pool block holding positions [i*block_size, (i+1)*block_size) (or kNullBlock);
  // covers at least context_begin + (token_end - token_begin) positions.
  std::vector<std::vector<int32_t>> block_tables;
};

// A token row whose id the host does not know yet (overlapped scheduling, --async-scheduling): the previous step
// sampled it on the device, as element `source` of ForwardBatch::token_source; tokens[row] holds a placeholder.
struct DeferredToken {
  int32_t row = 0;
  int32_t source = 0;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;             // all new tokens, sequence after sequence
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logit_rows;         // token rows whose logits are wanted (e.g. the last of each sequence)
  std::vector<DeferredToken> deferred_tokens;
  Tensor token_source;                     // I32 [N] on the model's backend, read before the step runs
};

}  // namespace beamline
