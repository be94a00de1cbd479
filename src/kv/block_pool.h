#pragma once
// One pool of fixed-size KV blocks shared by every layer group. Blocks are reference counted; an
// unreferenced block that holds a cached prefix (it has a hash) stays findable until it is evicted, least
// recently released first, and only when no plain free block is left.
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace beamline::kv {

using BlockId = int32_t;

// Blocks of different layer groups hold different layers' K/V, so the cache is keyed per group.
struct BlockKey {
  BlockHash hash;
  int32_t group = 0;
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
};

struct BlockKeyHasher {
  std::size_t operator()(const BlockKey& key) const noexcept {
    return std::hash<BlockHash>()(key.hash) ^ (static_cast<std::size_t>(key.group) * 0x2545f4914f6cdd1dULL);
  }
};

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Unreferenced blocks, plain and cached: what allocate() can hand out.
  int32_t num_free() const { return static_cast<int32_t>(plain_free_.size() + cached_free_.size()); }
  int32_t num_cached_free() const { return static_cast<int32_t>(cached_free_.size()); }
  int32_t num_cached() const { return static_cast<int32_t>(cache_.size()); }
  int32_t ref_count(BlockId block) const { return blocks_.at(block).ref_count; }
  uint64_t num_evictions() const { return evictions_; }

  // `count` blocks with one reference each: plain free blocks first, then evicted cached ones (least
  // recently released first). Fails when fewer than `count` are free: callers check num_free() first.
  std::vector<BlockId> allocate(int32_t count);
  // One more reference to a block (a cached block found by lookup may be unreferenced: it leaves the LRU).
  void acquire(BlockId block);
  // One reference less; at zero a hashed block joins the LRU as most recent, any other the plain free list.
  void release(BlockId block);

  std::optional<BlockId> lookup(const BlockKey& key) const;
  // Publishes a full, computed block under `key`. Ignored when the key already names another block (two
  // sequences computed the same block; the first stays canonical) or the block already has a key.
  void register_block(BlockId block, const BlockKey& key);
  // Forgets every cached prefix (unreferenced cached blocks become plain free blocks).
  void clear_cache();

 private:
  struct Block {
    int32_t ref_count = 0;
    std::optional<BlockKey> key;
    std::list<BlockId>::iterator lru_position;
  };
  void check_id(BlockId block) const;
  void forget_key(BlockId block);

  std::vector<Block> blocks_;
  std::vector<BlockId> plain_free_;       // a stack: the most recently freed is reused first
  std::list<BlockId> cached_free_;        // front = least recently released
  std::unordered_map<BlockKey, BlockId, BlockKeyHasher> cache_;
  uint64_t evictions_ = 0;
};

}  // namespace beamline::kv
