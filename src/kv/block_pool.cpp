#include "kv/block_pool.h"

#include "util/error.h"

namespace beamline::kv {

BlockPool::BlockPool(int32_t num_blocks) {
  require(num_blocks > 0, "KV block pool: needs at least one block (got {})", num_blocks);
  blocks_.resize(num_blocks);
  plain_free_.reserve(num_blocks);
  for (BlockId id = num_blocks - 1; id >= 0; --id) plain_free_.push_back(id);
}

void BlockPool::check_id(BlockId block) const {
  require(block >= 0 && block < num_blocks(), "KV block pool: block id {} out of range [0, {})", block, num_blocks());
}

std::vector<BlockId> BlockPool::allocate(int32_t count) {
  require(count >= 0 && count <= num_free(), "KV block pool: asked for {} blocks, {} free", count, num_free());
  std::vector<BlockId> result;
  result.reserve(count);
  while (static_cast<int32_t>(result.size()) < count) {
    BlockId id;
    if (!plain_free_.empty()) {
      id = plain_free_.back();
      plain_free_.pop_back();
    } else {
      id = cached_free_.front();
      cached_free_.pop_front();
      forget_key(id);
      ++evictions_;
    }
    blocks_[id].ref_count = 1;
    result.push_back(id);
  }
  return result;
}

void BlockPool::acquire(BlockId block) {
  check_id(block);
  Block& b = blocks_[block];
  if (b.ref_count == 0) {
    require(b.key.has_value(), "KV block pool: acquire of free uncached block {}", block);
    cached_free_.erase(b.lru_position);
  }
  ++b.ref_count;
}

void BlockPool::release(BlockId block) {
  check_id(block);
  Block& b = blocks_[block];
  require(b.ref_count > 0, "KV block pool: release of unreferenced block {}", block);
  if (--b.ref_count > 0) return;
  if (b.key) {
    b.lru_position = cached_free_.insert(cached_free_.end(), block);
  } else {
    plain_free_.push_back(block);
  }
}

std::optional<BlockId> BlockPool::lookup(const BlockKey& key) const {
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::register_block(BlockId block, const BlockKey& key) {
  check_id(block);
  Block& b = blocks_[block];
  if (b.key || cache_.contains(key)) return;
  b.key = key;
  cache_.emplace(key, block);
  if (b.ref_count == 0) {  // a free plain block would be unreachable from the LRU list: move it there
    std::erase(plain_free_, block);
    b.lru_position = cached_free_.insert(cached_free_.end(), block);
  }
}

void BlockPool::forget_key(BlockId block) {
  Block& b = blocks_[block];
  if (!b.key) return;
  cache_.erase(*b.key);
  b.key.reset();
}

void BlockPool::clear_cache() {
  for (BlockId id : cached_free_) {
    forget_key(id);
    plain_free_.push_back(id);
  }
  cached_free_.clear();
  for (BlockId id = 0; id < num_blocks(); ++id) forget_key(id);
}

}  // namespace beamline::kv
