#include "engine/prefix_router.h"

#include <algorithm>

#include "util/error.h"

namespace beamline {

DataParallelRouting parse_data_parallel_routing(std::string_view name) {
  if (name == "least-loaded") return DataParallelRouting::LeastLoaded;
  if (name == "prefix-aware") return DataParallelRouting::PrefixAware;
  fail("--data-parallel-routing: '{}' is not least-loaded or prefix-aware", name);
}

std::size_t least_loaded_engine(std::span<const int64_t> loads, std::size_t start) {
  std::size_t best = start;
  for (std::size_t i = 1; i < loads.size(); ++i) {
    const std::size_t at = (start + i) % loads.size();
    if (loads[at] < loads[best]) best = at;
  }
  return best;
}

bool within_prefix_load_bound(int64_t load, int64_t least) {
  return load <= std::max(least + 2, least + least / 2);
}

PrefixRouter::PrefixRouter(std::size_t num_engines, int32_t block_size, std::size_t blocks_per_engine)
    : engines_(num_engines), block_size_(block_size), blocks_per_engine_(std::max<std::size_t>(blocks_per_engine, 1)) {
  require(num_engines > 0 && block_size > 0, "prefix router: needs at least one engine and a positive block size");
}

std::size_t PrefixRouter::route(std::span<const TokenId> prompt, std::string_view cache_salt,
                                std::span<const int64_t> loads, std::size_t start) {
  require(loads.size() == engines_.size(), "prefix router: {} loads for {} engines", loads.size(), engines_.size());
  std::vector<kv::BlockHash> hashes;
  kv::extend_block_hashes(hashes, prompt, block_size_, cache_salt);
  const std::size_t least = least_loaded_engine(loads, start);
  std::size_t chosen = least;
  std::size_t most_matched = 0;
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    const std::size_t at = (start + i) % engines_.size();
    if (!within_prefix_load_bound(loads[at], loads[least])) continue;
    const std::size_t matched = matched_blocks(engines_[at], hashes);
    if (matched > most_matched || (matched == most_matched && matched > 0 && loads[at] < loads[chosen])) {
      chosen = at;
      most_matched = matched;
    }
  }
  remember(engines_[chosen], hashes);
  return chosen;
}

void PrefixRouter::clear() {
  for (EngineBlocks& engine : engines_) {
    engine.recent.clear();
    engine.where.clear();
  }
}

std::size_t PrefixRouter::matched_blocks(const EngineBlocks& engine, std::span<const kv::BlockHash> hashes) const {
  std::size_t matched = 0;
  while (matched < hashes.size() && engine.where.contains(hashes[matched])) ++matched;
  return matched;
}

void PrefixRouter::remember(EngineBlocks& engine, std::span<const kv::BlockHash> hashes) {
  // Back to front, so that a prompt's first blocks, which every longer prompt shares, are evicted last.
  for (auto hash_at = hashes.rbegin(); hash_at != hashes.rend(); ++hash_at) {
    const kv::BlockHash& hash = *hash_at;
    if (auto found = engine.where.find(hash); found != engine.where.end()) {
      engine.recent.splice(engine.recent.begin(), engine.recent, found->second);
      continue;
    }
    engine.recent.push_front(hash);
    engine.where.emplace(hash, engine.recent.begin());
    if (engine.recent.size() > blocks_per_engine_) {
      engine.where.erase(engine.recent.back());
      engine.recent.pop_back();
    }
  }
}

}  // namespace beamline
