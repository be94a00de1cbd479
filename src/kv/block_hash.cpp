#include "kv/block_hash.h"

#include <random>

#include "util/counter_random.h"

namespace beamline::kv {
namespace {

struct Seeds {
  uint64_t high, low;
};

const Seeds& process_seeds() {
  static const Seeds seeds = [] {
    std::random_device device;
    auto draw = [&] { return (static_cast<uint64_t>(device()) << 32) ^ device(); };
    return Seeds{draw(), draw()};
  }();
  return seeds;
}

class Hasher {
 public:
  explicit Hasher(const BlockHash& start)
      : high_(start.high ^ process_seeds().high), low_(start.low ^ process_seeds().low) {}
  void add(uint64_t word) {
    high_ = finalize64(high_ ^ word) + 0x9e3779b97f4a7c15ULL;
    low_ = finalize64(low_ + word * 0xc2b2ae3d27d4eb4fULL) ^ 0x165667b19e3779f9ULL;
  }
  BlockHash finish(uint64_t length) {
    add(length);
    return BlockHash{finalize64(high_), finalize64(low_ ^ high_)};
  }

 private:
  uint64_t high_, low_;
};

}  // namespace

BlockHash root_block_hash(std::string_view extra_keys) {
  Hasher hasher(BlockHash{0x6b76726f6f74ULL, 0});
  uint64_t word = 0;
  std::size_t filled = 0;
  for (char c : extra_keys) {
    word |= static_cast<uint64_t>(static_cast<unsigned char>(c)) << (8 * filled);
    if (++filled == 8) {
      hasher.add(word);
      word = 0;
      filled = 0;
    }
  }
  if (filled > 0) hasher.add(word);
  return hasher.finish(extra_keys.size());
}

BlockHash hash_block(const BlockHash& parent, std::span<const int32_t> tokens) {
  Hasher hasher(parent);
  for (int32_t token : tokens) hasher.add(static_cast<uint32_t>(token));
  return hasher.finish(tokens.size());
}

void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const int32_t> tokens, int32_t block_size,
                         std::string_view extra_keys) {
  const std::size_t full_blocks = tokens.size() / static_cast<std::size_t>(block_size);
  if (hashes.size() >= full_blocks) return;
  BlockHash parent = hashes.empty() ? root_block_hash(extra_keys) : hashes.back();
  for (std::size_t i = hashes.size(); i < full_blocks; ++i) {
    parent = hash_block(parent, tokens.subspan(i * block_size, block_size));
    hashes.push_back(parent);
  }
}

}  // namespace beamline::kv
