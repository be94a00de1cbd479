#pragma once
// Paged KV for many sequences over one block pool, for a hybrid layout (vLLM's hybrid allocator design):
// every KV group has its own block table per sequence. Full-attention groups hold every block of a
// sequence; sliding-window groups hold only the blocks intersecting the last `sliding_window` positions
// and give the rest back as soon as they leave the window (the table entry becomes kNullBlock, so table
// shapes stay fixed). Allocation for a step is all-or-nothing across groups.
//
// Prefix caching: full computed blocks are published under the hash of (parent hash, token ids), the
// root carrying the sequence's salt. A new sequence reuses the longest cached prefix that every group can
// serve: the full-attention hit, shortened until each sliding group also holds the blocks covering the
// last window before that point. The last token is never reused, so the step that finishes the prompt
// always computes at least one token and yields logits.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_cache_layout.h"

namespace beamline::kv {

using SeqId = int64_t;
using BlockTables = std::vector<std::vector<BlockId>>;  // [group][block index]

struct PrefixHit {
  int32_t num_tokens = 0;            // a multiple of block_size
  BlockTables tables;                // [group][num_tokens / block_size], kNullBlock where a sliding group needs nothing
  std::vector<BlockHash> hashes;     // of every full block of the looked-up tokens
};

struct PrefixCacheCounters {
  uint64_t queries = 0;  // tokens looked up
  uint64_t hits = 0;     // tokens found
};

class KvCacheManager {
 public:
  // `sliding_window` applies to the groups the layout marks sliding.
  KvCacheManager(const KvCacheLayout& layout, int32_t sliding_window, bool enable_prefix_caching);

  const KvCacheLayout& layout() const { return layout_; }
  int32_t block_size() const { return layout_.block_size; }
  bool prefix_caching() const { return prefix_caching_; }
  const BlockPool& pool() const { return pool_; }
  // Fraction of the pool referenced by sequences (cached-but-unreferenced blocks count as free).
  double usage() const;
  PrefixCacheCounters prefix_counters() const { return counters_; }

  // The longest reusable cached prefix of `tokens` for a sequence that holds no blocks yet, leaving at least
  // `min_computed` (>= 1) of the last tokens to compute. With `count_in_stats` the lookup adds to the prefix-cache
  // counters (first admission of a request; not a resume after preemption). Without prefix caching the hit is empty.
  PrefixHit find_cached_prefix(std::span<const int32_t> tokens, std::string_view salt, bool count_in_stats,
                               int32_t min_computed = 1);

  // Makes the tables of `seq` cover positions [0, num_computed + num_new), in every group or in none:
  // returns false, having taken nothing, when the pool lacks blocks. A sequence's first call may pass the
  // `hit` from find_cached_prefix (then num_computed must equal hit->num_tokens). Sliding blocks that the
  // new tokens no longer see are given back first, whatever the outcome.
  bool allocate(SeqId seq, std::span<const int32_t> tokens, std::string_view salt, int32_t num_computed,
                int32_t num_new, const PrefixHit* hit = nullptr);
  // After a step: positions [0, num_computed) of `tokens` are in the cache; publishes their full blocks.
  void commit(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed);
  // Rolls `seq` back to its first `num_tokens` positions (speculative decoding's rejected drafts): blocks that hold
  // only later positions go back to the pool, in every group. Published blocks must lie within them.
  void truncate(SeqId seq, int32_t num_tokens);
  // Gives back every block of `seq` (hashed blocks stay cached, tail blocks become the first to evict).
  void free(SeqId seq);

  bool holds(SeqId seq) const { return sequences_.contains(seq); }
  const BlockTables& block_tables(SeqId seq) const;
  int32_t num_held_blocks(SeqId seq) const;  // non-null table entries
  // Layer-token slots saved against keeping every layer's KV for every position (signed: block padding of
  // small groups can cost more than short sequences save).
  int64_t saved_layer_token_slots(SeqId seq) const;

  // Blocks one sequence of `length` tokens can need at once when steps add at most `max_step_tokens`.
  int64_t max_blocks_for_sequence(int64_t length, int64_t max_step_tokens) const;
  // Clears the prefix cache (referenced blocks keep working; nothing is reusable afterwards).
  void reset_prefix_cache() { pool_.clear_cache(); }

 private:
  struct SequenceKv {
    std::string salt;
    BlockTables tables;
    std::vector<BlockHash> hashes;
    int32_t num_published_blocks = 0;
    int32_t num_held_blocks = 0;  // non-null table entries
  };
  int32_t first_needed_block(int32_t num_computed) const;  // sliding groups
  int32_t window_blocks() const;                          // sliding blocks a cache hit must hold
  int32_t full_group_hit(int32_t group, const std::vector<BlockHash>& hashes, int32_t max_blocks) const;
  int32_t sliding_group_hit(int32_t group, const std::vector<BlockHash>& hashes, int32_t max_blocks) const;
  SequenceKv& state(SeqId seq);
  const SequenceKv& state(SeqId seq) const;

  KvCacheLayout layout_;
  int32_t sliding_window_;
  bool prefix_caching_;
  BlockPool pool_;
  std::unordered_map<SeqId, SequenceKv> sequences_;
  PrefixCacheCounters counters_;
};

}  // namespace beamline::kv
