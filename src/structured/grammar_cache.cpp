#include "structured/grammar_cache.h"

#include "structured/harmony_constraint.h"

namespace beamline {

GrammarCache::GrammarCache(const Tokenizer& tokenizer, std::size_t capacity) : tokenizer_(tokenizer), capacity_(capacity) {
  require(capacity >= 1, "grammar cache: capacity {} must be at least 1", capacity);
}

std::shared_ptr<const Vocabulary> GrammarCache::vocabulary(GrammarVocabulary kind) {
  const std::lock_guard lock(vocabulary_mutex_);
  if (kind == GrammarVocabulary::kHarmony) {
    if (!harmony_) harmony_ = harmony_vocabulary(tokenizer_);
    return harmony_;
  }
  if (!plain_) plain_ = Vocabulary::from_tokenizer(tokenizer_);
  return plain_;
}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& key, GrammarVocabulary vocabulary_kind,
                                                         const std::function<Grammar()>& build,
                                                         std::vector<TokenId> stop_tokens) {
  const std::string full_key = std::string(vocabulary_kind == GrammarVocabulary::kHarmony ? "harmony\n" : "plain\n") + key;
  {
    const std::lock_guard lock(mutex_);
    if (const auto found = index_.find(full_key); found != index_.end()) {
      order_.splice(order_.begin(), order_, found->second);
      ++counters_.hits;
      return found->second->second;
    }
    ++counters_.misses;
  }
  auto compiled = CompiledGrammar::compile(build(), vocabulary(vocabulary_kind), std::move(stop_tokens));
  const std::lock_guard lock(mutex_);
  if (index_.contains(full_key)) return compiled;  // another thread compiled it meanwhile
  order_.emplace_front(full_key, compiled);
  index_.emplace(full_key, order_.begin());
  while (order_.size() > capacity_) {
    index_.erase(order_.back().first);
    order_.pop_back();
  }
  return compiled;
}

GrammarCache::Counters GrammarCache::counters() const {
  const std::lock_guard lock(mutex_);
  Counters counters = counters_;
  counters.size = order_.size();
  return counters;
}

}  // namespace beamline
