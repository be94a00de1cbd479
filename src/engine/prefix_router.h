#pragma once
// Which data-parallel engine a new request goes to. Least-loaded is vLLM's rule (fewest unfinished requests). Each
// engine has its own prefix cache, so least-loaded scatters the turns of one conversation over engines that each
// recompute the shared prefix; prefix-aware routing sends a request to the engine that most recently took the
// longest prefix of its prompt (block hashes, as the prefix cache keys its blocks), unless that engine is too far
// above the least loaded one, when the load decides. Not thread-safe: EngineClient serialises calls.
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

enum class DataParallelRouting { LeastLoaded, PrefixAware };

// "least-loaded" or "prefix-aware"; anything else throws naming --data-parallel-routing.
DataParallelRouting parse_data_parallel_routing(std::string_view name);

// The least loaded engine, searching from `start` so that ties go round.
std::size_t least_loaded_engine(std::span<const int64_t> loads, std::size_t start);

// Whether an engine with `load` unfinished requests may take a request for its cached prefix while the least loaded
// engine has `least`: up to two more requests, or half as many again under heavy load.
bool within_prefix_load_bound(int64_t load, int64_t least);

class PrefixRouter {
 public:
  // `blocks_per_engine`: how many block hashes to remember per engine (about what its KV pool can cache).
  PrefixRouter(std::size_t num_engines, int32_t block_size, std::size_t blocks_per_engine);

  // The engine for a prompt; remembers its full blocks as that engine's. `loads[e]` is engine e's unfinished requests.
  std::size_t route(std::span<const TokenId> prompt, std::string_view cache_salt, std::span<const int64_t> loads,
                    std::size_t start);
  // Forgets every engine's blocks (their prefix caches were reset).
  void clear();

 private:
  struct EngineBlocks {
    std::list<kv::BlockHash> recent;  // most recently routed first
    std::unordered_map<kv::BlockHash, std::list<kv::BlockHash>::iterator> where;
  };
  std::size_t matched_blocks(const EngineBlocks& engine, std::span<const kv::BlockHash> hashes) const;
  void remember(EngineBlocks& engine, std::span<const kv::BlockHash> hashes);

  std::vector<EngineBlocks> engines_;
  int32_t block_size_;
  std::size_t blocks_per_engine_;
};

}  // namespace beamline
