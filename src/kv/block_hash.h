#pragma once
// Content hashes of full KV blocks for prefix caching. A block's hash covers its parent's hash and its
// token ids, so equal hashes mean equal prefixes; the root (parent of block 0) carries the extra keys
// (e.g. a per-tenant cache salt), so requests with different salts never share blocks.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace beamline::kv {

// 128 bits keyed with a per-process random seed: accidental collisions are negligible and clients
// cannot craft colliding prompts without knowing the seed.
struct BlockHash {
  uint64_t high = 0, low = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

BlockHash root_block_hash(std::string_view extra_keys);
BlockHash hash_block(const BlockHash& parent, std::span<const int32_t> tokens);

// Extends `hashes` to cover every full block of `tokens` (hashes already present are kept).
void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const int32_t> tokens, int32_t block_size,
                         std::string_view extra_keys);

}  // namespace beamline::kv

template <>
struct std::hash<beamline::kv::BlockHash> {
  std::size_t operator()(const beamline::kv::BlockHash& h) const noexcept { return h.low ^ (h.high * 0x9e3779b97f4a7c15ULL); }
};
