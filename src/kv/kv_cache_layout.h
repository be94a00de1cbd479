#pragma once
// The contract between the KV cache manager (kv/), the KV storage the runner allocates (runner/kv_cache.h) and the
// model that reads it: how the paged pool maps onto layers, and which keys a query may see.
#include <algorithm>
#include <cstdint>
#include <vector>

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

// The first key position a query at `position` may see: 0 for full attention (sliding_window <= 0), else the
// oldest position still inside the window (key t is visible iff t <= position && position - t < sliding_window).
// Every place that frees blocks behind a window or plans attention over it uses this one rule.
constexpr int64_t first_visible_position(int64_t position, int64_t sliding_window) {
  return sliding_window > 0 ? std::max<int64_t>(0, position - sliding_window + 1) : 0;
}

// Element offset of (block, slot, position in the block, kv head) in a pool [num_blocks, slots_per_block,
// block_size, num_kv_heads, head_dim], the one rule every backend addresses K and V by (constexpr: device code calls
// it too). In 64 bits: a pool passes 2^31 elements at 65,536 blocks of 16 tokens x 2 slots x 8 heads x 128, which a
// 1M-token context of Beam-1.0's two-global-layer cut fills (docs/long-context.md).
constexpr int64_t kv_pool_offset(int64_t block, int64_t slot, int64_t in_block, int64_t kv_head, int64_t slots_per_block,
                                 int64_t block_size, int64_t num_kv_heads, int64_t head_dim) {
  return (((block * slots_per_block + slot) * block_size + in_block) * num_kv_heads + kv_head) * head_dim;
}

}  // namespace beamline
