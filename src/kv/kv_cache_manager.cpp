#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "util/error.h"

namespace beamline::kv {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

KvCacheManager::KvCacheManager(const KvCacheLayout& layout, int32_t sliding_window, bool enable_prefix_caching)
    : layout_(layout), sliding_window_(sliding_window), prefix_caching_(enable_prefix_caching), pool_(layout.num_blocks) {
  require(layout.block_size > 0, "KV layout: block_size must be positive (got {})", layout.block_size);
  require(layout.num_groups() > 0, "KV layout: no KV groups");
  require(layout.slots_per_block > 0, "KV layout: slots_per_block must be positive (got {})", layout.slots_per_block);
  const bool any_sliding = std::find(layout.group_is_sliding.begin(), layout.group_is_sliding.end(), true) !=
                           layout.group_is_sliding.end();
  require(!any_sliding || sliding_window > 0, "KV layout: sliding groups need sliding_window > 0 (got {})",
          sliding_window);
}

double KvCacheManager::usage() const {
  return 1.0 - static_cast<double>(pool_.num_free()) / static_cast<double>(pool_.num_blocks());
}

int32_t KvCacheManager::first_needed_block(int32_t num_computed) const {
  // The first new token, at position num_computed, sees the oldest key any token of this step or a later one sees.
  return static_cast<int32_t>(first_visible_position(num_computed, sliding_window_) / layout_.block_size);
}

int32_t KvCacheManager::window_blocks() const {
  return static_cast<int32_t>(ceil_div(sliding_window_ - 1, layout_.block_size));
}

int32_t KvCacheManager::full_group_hit(int32_t group, const std::vector<BlockHash>& hashes, int32_t max_blocks) const {
  int32_t length = 0;
  while (length < max_blocks && pool_.lookup(BlockKey{hashes[length], group})) ++length;
  return length;
}

int32_t KvCacheManager::sliding_group_hit(int32_t group, const std::vector<BlockHash>& hashes,
                                          int32_t max_blocks) const {
  // The longest hit of at most max_blocks blocks whose last window_blocks() blocks are all cached; a
  // run of cached blocks starting at block 0 serves any length up to its end.
  const int32_t needed = window_blocks();
  if (needed == 0) return max_blocks;
  int32_t run = 0;
  for (int32_t i = max_blocks - 1; i >= 0; --i) {
    if (pool_.lookup(BlockKey{hashes[i], group})) {
      if (++run == needed) return i + needed;
    } else {
      run = 0;
    }
  }
  return run;
}

PrefixHit KvCacheManager::find_cached_prefix(std::span<const int32_t> tokens, std::string_view salt,
                                             bool count_in_stats, int32_t min_computed) {
  require(min_computed >= 1, "prefix lookup: at least one token is computed (min_computed {})", min_computed);
  PrefixHit hit;
  hit.tables.resize(layout_.num_groups());
  if (!prefix_caching_ || tokens.empty()) return hit;
  extend_block_hashes(hit.hashes, tokens, layout_.block_size, salt);

  const auto reusable = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - min_computed);
  auto length = static_cast<int32_t>(reusable / layout_.block_size);
  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    if (!layout_.group_is_sliding[g]) length = std::min(length, full_group_hit(g, hit.hashes, length));
  }
  for (bool changed = true; changed && length > 0;) {  // shortening for one group may break another's window
    changed = false;
    for (int32_t g = 0; g < layout_.num_groups(); ++g) {
      if (!layout_.group_is_sliding[g]) continue;
      const int32_t group_length = sliding_group_hit(g, hit.hashes, length);
      if (group_length < length) {
        length = group_length;
        changed = true;
      }
    }
  }

  for (int32_t g = 0; g < layout_.num_groups(); ++g) {
    const int32_t first = layout_.group_is_sliding[g] ? std::max(0, length - window_blocks()) : 0;
    hit.tables[g].assign(length, kNullBlock);
    for (int32_t i = first; i < length; ++i) hit.tables[g][i] = *pool_.lookup(BlockKey{hit.hashes[i], g});
  }
  hit.num_tokens = length * layout_.block_size;
  if (count_in_stats) {
    counters_.queries += tokens.size();
    counters_.hits += hit.num_tokens;
  }
  return hit;
}

bool KvCacheManager::allocate(SeqId seq, std::span<const int32_t> tokens, std::string_view salt, int32_t num_computed,
                              int32_t num_new, const PrefixHit* hit) {
  require(num_computed >= 0 && num_new >= 0 && num_computed + num_new <= static_cast<int64_t>(tokens.size()),
          "KV allocate: {} computed + {} new tokens exceed the sequence's {} tokens", num_computed, num_new,
          tokens.size());
  const bool is_new = !sequences_.contains(seq);
  require(hit == nullptr || is_new, "KV allocate: a prefix hit applies only to a sequence holding no blocks");
  require(!is_new || num_computed == (hit ? hit->num_tokens : 0),
          "KV allocate: a new sequence starts at its prefix hit ({} tokens), not at {}", hit ? hit->num_tokens : 0,
          num_computed);
  const int32_t num_groups = layout_.num_groups();
  const int32_t target_blocks = static_cast<int32_t>(ceil_div(num_computed + num_new, layout_.block_size));
  const int32_t first_needed = first_needed_block(num_computed);

  if (!is_new) {
    SequenceKv& kv = sequences_.at(seq);
    for (int32_t g = 0; g < num_groups; ++g) {
      if (!layout_.group_is_sliding[g]) continue;
      auto& table = kv.tables[g];
      for (int32_t i = 0; i < std::min<int32_t>(first_needed, static_cast<int32_t>(table.size())); ++i) {
        if (table[i] == kNullBlock) continue;
        pool_.release(table[i]);
        table[i] = kNullBlock;
        --kv.num_held_blocks;
      }
    }
  }

  int32_t blocks_to_take = 0;
  for (int32_t g = 0; g < num_groups; ++g) {
    const int32_t length =
        static_cast<int32_t>(is_new ? (hit ? hit->tables[g].size() : 0) : sequences_.at(seq).tables[g].size());
    const int32_t start = layout_.group_is_sliding[g] ? std::max(length, first_needed) : length;
    blocks_to_take += std::max(0, target_blocks - start);
    if (hit) {
      for (BlockId block : hit->tables[g]) {
        if (block != kNullBlock && pool_.ref_count(block) == 0) ++blocks_to_take;
      }
    }
  }
  if (blocks_to_take > pool_.num_free()) return false;

  SequenceKv& kv = is_new ? sequences_[seq] : sequences_.at(seq);
  if (is_new) {
    kv.salt = salt;
    kv.tables.resize(num_groups);
    if (hit) {
      kv.tables = hit->tables;
      kv.hashes = hit->hashes;
      kv.hashes.resize(hit->num_tokens / layout_.block_size);
      kv.num_published_blocks = hit->num_tokens / layout_.block_size;
      for (const auto& table : kv.tables) {
        for (BlockId block : table) {
          if (block == kNullBlock) continue;
          pool_.acquire(block);
          ++kv.num_held_blocks;
        }
      }
    }
  }
  for (int32_t g = 0; g < num_groups; ++g) {
    auto& table = kv.tables[g];
    while (static_cast<int32_t>(table.size()) < target_blocks) {
      const bool skipped = layout_.group_is_sliding[g] && static_cast<int32_t>(table.size()) < first_needed;
      table.push_back(skipped ? kNullBlock : pool_.allocate(1).front());
      if (!skipped) ++kv.num_held_blocks;
    }
  }
  return true;
}

void KvCacheManager::commit(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed) {
  SequenceKv& kv = state(seq);
  if (!prefix_caching_) return;
  const int32_t full_blocks = num_computed / layout_.block_size;
  if (full_blocks <= kv.num_published_blocks) return;
  require(static_cast<int64_t>(tokens.size()) >= num_computed, "KV commit: {} computed tokens but the sequence has {}",
          num_computed, tokens.size());
  extend_block_hashes(kv.hashes, tokens.first(static_cast<std::size_t>(full_blocks) * layout_.block_size),
                      layout_.block_size, kv.salt);
  for (int32_t i = kv.num_published_blocks; i < full_blocks; ++i) {
    for (int32_t g = 0; g < layout_.num_groups(); ++g) {
      const BlockId block = kv.tables[g].at(i);
      if (block != kNullBlock) pool_.register_block(block, BlockKey{kv.hashes[i], g});
    }
  }
  kv.num_published_blocks = full_blocks;
}

void KvCacheManager::truncate(SeqId seq, int32_t num_tokens) {
  SequenceKv& kv = state(seq);
  require(num_tokens >= kv.num_published_blocks * layout_.block_size,
          "KV truncate: sequence {} cannot drop below its {} published blocks (to {} tokens)", seq,
          kv.num_published_blocks, num_tokens);
  const auto keep = static_cast<std::size_t>(ceil_div(num_tokens, layout_.block_size));
  for (auto& table : kv.tables) {
    while (table.size() > keep) {
      if (table.back() != kNullBlock) {
        pool_.release(table.back());
        --kv.num_held_blocks;
      }
      table.pop_back();
    }
  }
}

void KvCacheManager::free(SeqId seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  BlockTables& tables = it->second.tables;
  for (auto& table : tables) {
    for (auto block = table.rbegin(); block != table.rend(); ++block) {
      if (*block != kNullBlock) pool_.release(*block);
    }
  }
  sequences_.erase(it);
}

KvCacheManager::SequenceKv& KvCacheManager::state(SeqId seq) {
  auto it = sequences_.find(seq);
  require(it != sequences_.end(), "KV cache: sequence {} holds no blocks", seq);
  return it->second;
}

const KvCacheManager::SequenceKv& KvCacheManager::state(SeqId seq) const {
  auto it = sequences_.find(seq);
  require(it != sequences_.end(), "KV cache: sequence {} holds no blocks", seq);
  return it->second;
}

const BlockTables& KvCacheManager::block_tables(SeqId seq) const { return state(seq).tables; }

int32_t KvCacheManager::num_held_blocks(SeqId seq) const { return state(seq).num_held_blocks; }

int64_t KvCacheManager::saved_layer_token_slots(SeqId seq) const {
  const SequenceKv& kv = state(seq);
  const int64_t positions = static_cast<int64_t>(kv.tables.front().size()) * layout_.block_size;
  const int64_t every_layer = positions * static_cast<int64_t>(layout_.layer_group.size());
  const int64_t held = static_cast<int64_t>(num_held_blocks(seq)) * layout_.slots_per_block * layout_.block_size;
  return every_layer - held;
}

int64_t KvCacheManager::max_blocks_for_sequence(int64_t length, int64_t max_step_tokens) const {
  const int64_t all_blocks = ceil_div(length, layout_.block_size);
  const int64_t window = std::min(all_blocks, window_blocks() + ceil_div(max_step_tokens, layout_.block_size) + 1);
  int64_t total = 0;
  for (bool sliding : layout_.group_is_sliding) total += sliding ? window : all_blocks;
  return total;
}

}  // namespace beamline::kv
