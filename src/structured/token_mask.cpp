#include "structured/token_mask.h"

#include <algorithm>
#include <numeric>

namespace beamline {

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  std::vector<TokenId> specials;
  for (TokenId id = 0; id < static_cast<TokenId>(bytes.size()); ++id) {
    if (tokenizer.is_special(id)) { specials.push_back(id); continue; }
    try {
      bytes[id] = std::string(tokenizer.token_bytes(id));
    } catch (const std::exception&) {  // a gap in the id space: an empty token never matches
    }
  }
  return from_tokens(std::move(bytes), std::move(specials));
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokens(std::vector<std::string> token_bytes,
                                                          std::vector<TokenId> special_ids) {
  auto v = std::make_shared<Vocabulary>();
  v->token_bytes_ = std::move(token_bytes);
  v->special_.assign(v->token_bytes_.size(), 0);
  for (TokenId id : special_ids) v->special_.at(id) = 1;
  v->build_trie();
  return v;
}

void Vocabulary::build_trie() {
  for (TokenId id = 0; id < size(); ++id)
    if (!special_[id] && !token_bytes_[id].empty()) sorted_.push_back(id);
  std::sort(sorted_.begin(), sorted_.end(),
            [&](TokenId a, TokenId b) { return token_bytes_[a] != token_bytes_[b] ? token_bytes_[a] < token_bytes_[b] : a < b; });
  std::vector<int32_t> path;  // path[d] = node at depth d + 1 on the current token's path
  std::string_view previous;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth) {
      subtree_end_[path.back()] = num_nodes();
      path.pop_back();
    }
  };
  for (int32_t i = 0; i < num_sorted(); ++i) {
    std::string_view bytes = token_bytes_[sorted_[i]];
    size_t common = 0;
    while (common < std::min(bytes.size(), previous.size()) && bytes[common] == previous[common]) ++common;
    close_to(common);
    for (size_t d = common; d < bytes.size(); ++d) {
      path.push_back(num_nodes());
      node_byte_.push_back(static_cast<uint8_t>(bytes[d]));
      node_depth_.push_back(static_cast<int32_t>(d + 1));
      subtree_end_.push_back(-1);
      first_token_.push_back(i);
      own_tokens_.push_back(0);
    }
    ++own_tokens_[path.back()];
    previous = bytes;
  }
  close_to(0);
  first_token_.push_back(num_sorted());  // first_token(num_nodes()) closes the last subtree's range
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(const Grammar& grammar,
                                                                std::shared_ptr<const Vocabulary> vocabulary,
                                                                std::vector<TokenId> stop_tokens) {
  auto g = std::make_shared<CompiledGrammar>();
  g->tables_ = PushdownTables::build(grammar);
  g->vocabulary_ = std::move(vocabulary);
  g->stop_tokens_ = std::move(stop_tokens);
  if (g->vocabulary_) g->classify_tokens();
  return g;
}

size_t CompiledGrammar::uncertain_total() const {
  size_t total = 0;
  for (const StateTokens& s : state_tokens_) total += s.uncertain.size();
  return total;
}

// One preorder pass over the trie per state that reads bytes, from that state alone over the sentinel;
// a subtree whose prefix is already rejected (or already past the rule's end) is skipped whole.
void CompiledGrammar::classify_tokens() {
  const Vocabulary& v = *vocabulary_;
  ConfigurationSpace space(tables_);
  state_tokens_.resize(tables_.num_states);
  std::vector<int32_t> config_at_depth;
  std::vector<TokenId> accepted;
  for (int32_t state = 0; state < tables_.num_states; ++state) {
    if (tables_.out_bytes[state].empty()) continue;
    StateTokens& out = state_tokens_[state];
    accepted.clear();
    config_at_depth.assign(1, space.start(state, kSentinelParent));
    for (int32_t n = 0; n < v.num_nodes();) {
      int32_t depth = v.node_depth(n);
      int32_t config = space.step(config_at_depth[depth - 1], v.node_byte(n));
      const ConfigurationSpace::Configuration& c = space.at(config);
      if (!c.alive_within_frame()) {
        if (c.popped)
          for (int32_t i = v.first_token(n); i < v.first_token(v.subtree_end(n)); ++i) out.uncertain.push_back(i);
        n = v.subtree_end(n);
        continue;
      }
      for (int32_t i = 0; i < v.own_tokens(n); ++i) accepted.push_back(v.sorted(v.first_token(n) + i));
      config_at_depth.resize(depth + 1);
      config_at_depth[depth] = config;
      ++n;
    }
    // A list costs 4 bytes a token, a bitmask 1 bit: keep whichever is smaller.
    if (accepted.size() * 32 > static_cast<size_t>(v.size())) {
      out.accepted_mask.assign(v.mask_words(), 0);
      for (TokenId t : accepted) out.accepted_mask[t >> 5] |= 1u << (t & 31);
    } else {
      out.accepted_ids = accepted;
    }
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), space_(grammar_->tables()) {
  history_.push_back(space_.start(grammar_->tables().root_start, kRootParent));
  terminated_.push_back(0);
}

bool GrammarMatcher::matches(const CompiledGrammar& grammar, std::string_view bytes) {
  ConfigurationSpace space(grammar.tables());
  int32_t config = space.walk(space.start(grammar.tables().root_start, kRootParent), bytes);
  return space.at(config).can_end;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (terminated()) return false;
  int32_t config = space_.walk(history_.back(), bytes);
  if (!space_.at(config).alive()) return false;
  history_.push_back(config);
  terminated_.push_back(0);
  return true;
}

bool GrammarMatcher::accept_token(TokenId token) {
  const Vocabulary* v = grammar_->vocabulary();
  require(v != nullptr && token >= 0 && token < v->size(), "grammar matcher: token {} outside the vocabulary", token);
  if (terminated()) return false;
  if (v->is_special(token)) {
    const auto& stops = grammar_->stop_tokens();
    if (!can_end() || std::find(stops.begin(), stops.end(), token) == stops.end()) return false;
    history_.push_back(history_.back());
    terminated_.push_back(1);
    return true;
  }
  if (v->bytes(token).empty()) return false;
  return accept_bytes(v->bytes(token));
}

void GrammarMatcher::rollback(int32_t steps) {
  require(steps >= 0 && steps <= this->steps(), "grammar matcher: cannot roll back {} of {} steps", steps,
          this->steps());
  history_.resize(history_.size() - steps);
  terminated_.resize(terminated_.size() - steps);
}

std::string GrammarMatcher::jump_forward_bytes() {
  std::string forced;
  int32_t config = history_.back();
  while (!terminated() && forced.size() < 4096) {
    const auto& c = space_.at(config);
    if (c.can_end || c.bytes.count() != 1) break;
    uint8_t byte = 0;
    while (!c.bytes.contains(byte)) ++byte;
    forced += static_cast<char>(byte);
    config = space_.step(config, byte);
  }
  return forced;
}

void GrammarMatcher::fill_next_token_mask(std::span<uint32_t> mask) {
  const Vocabulary& v = *grammar_->vocabulary();
  require(mask.size() >= static_cast<size_t>(v.mask_words()), "grammar matcher: mask of {} words, need {}",
          mask.size(), v.mask_words());
  std::fill(mask.begin(), mask.end(), 0u);
  if (terminated()) return;
  int32_t config = history_.back();
  const auto& c = space_.at(config);
  // Stack tops in one state share their precomputed sets; nodes are sorted by id, not state, so dedupe.
  int32_t seen_states[64];
  int32_t num_seen = 0;
  std::vector<int32_t> extra_states;
  for (int32_t node : c.nodes) {
    int32_t state = space_.state_of(node);
    if (std::find(seen_states, seen_states + num_seen, state) != seen_states + num_seen) continue;
    if (std::find(extra_states.begin(), extra_states.end(), state) != extra_states.end()) continue;
    if (num_seen < 64) seen_states[num_seen++] = state;
    else extra_states.push_back(state);
  }
  extra_states.insert(extra_states.begin(), seen_states, seen_states + num_seen);
  for (int32_t state : extra_states) {
    const auto& tokens = grammar_->state_tokens(state);
    if (!tokens.accepted_mask.empty()) {
      for (int32_t w = 0; w < v.mask_words(); ++w) mask[w] |= tokens.accepted_mask[w];
    } else {
      for (TokenId t : tokens.accepted_ids) mask[t >> 5] |= 1u << (t & 31);
    }
  }
  for (int32_t state : extra_states) walk_uncertain(grammar_->state_tokens(state).uncertain, config, mask);
  if (c.can_end)
    for (TokenId t : grammar_->stop_tokens()) mask[t >> 5] |= 1u << (t & 31);
}

// The uncertain tokens are in byte order, so each walk resumes from the longest prefix it shares with the
// previous token (a trie walk restricted to them).
void GrammarMatcher::walk_uncertain(const std::vector<int32_t>& uncertain, int32_t config, std::span<uint32_t> mask) {
  const Vocabulary& v = *grammar_->vocabulary();
  walk_stack_.assign(1, config);
  std::string_view previous;
  for (int32_t index : uncertain) {
    TokenId token = v.sorted(index);
    if ((mask[token >> 5] >> (token & 31)) & 1) { continue; }
    std::string_view bytes = v.bytes(token);
    size_t common = 0;
    size_t limit = std::min({bytes.size(), previous.size(), walk_stack_.size() - 1});
    while (common < limit && bytes[common] == previous[common]) ++common;
    walk_stack_.resize(common + 1);
    int32_t at = walk_stack_.back();
    for (size_t d = common; d < bytes.size(); ++d) {
      at = at == ConfigurationSpace::kDead ? at : space_.step(at, static_cast<uint8_t>(bytes[d]));
      walk_stack_.push_back(at);
    }
    previous = bytes;
    if (space_.at(at).alive()) mask[token >> 5] |= 1u << (token & 31);
  }
}

}  // namespace beamline
