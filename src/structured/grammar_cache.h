#pragma once
// Compiled grammars by what they were compiled from (LRU, bounded), and the vocabularies of one tokenizer: the
// plain one and Harmony's (special tokens as grammar bytes), each built once, on first use. Requests repeat their
// schemas and tools, and compiling classifies every token per automaton state, so a hit saves the compile.
// Thread-safe: the server's HTTP threads share one cache.
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

enum class GrammarVocabulary : uint8_t { kPlain, kHarmony };

class GrammarCache {
 public:
  // `tokenizer` must outlive the cache. capacity >= 1.
  GrammarCache(const Tokenizer& tokenizer, std::size_t capacity);

  // The grammar compiled for `key` (which must name everything `build` and `stop_tokens` depend on); on a miss
  // `build` makes it, outside the lock (a compile error, e.g. UnsupportedGrammar, propagates and nothing is cached).
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, GrammarVocabulary vocabulary,
                                             const std::function<Grammar()>& build, std::vector<TokenId> stop_tokens);

  struct Counters {
    uint64_t hits = 0, misses = 0;
    std::size_t size = 0;
  };
  Counters counters() const;

 private:
  std::shared_ptr<const Vocabulary> vocabulary(GrammarVocabulary kind);

  const Tokenizer& tokenizer_;
  const std::size_t capacity_;
  std::mutex vocabulary_mutex_;  // held while one is built (a failed build leaves it to the next call)
  std::shared_ptr<const Vocabulary> plain_, harmony_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> order_;  // most recent first
  std::unordered_map<std::string, decltype(order_)::iterator> index_;
  Counters counters_;
};

}  // namespace beamline
