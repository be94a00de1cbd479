#include "structured/token_mask.h"

#include <algorithm>
#include <array>
#include <bit>
#include <numeric>
#include <unordered_map>

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
  single_byte_token_.fill(-1);
  for (TokenId id = size() - 1; id >= 0; --id)
    if (!special_[id] && token_bytes_[id].size() == 1) single_byte_token_[static_cast<uint8_t>(token_bytes_[id][0])] = id;
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
  summarize_subtrees();
}

// In reverse preorder every node comes after its descendants, so one pass folds each subtree's bytes into its
// root's set (the parent of n is the nearest earlier node one level up, tracked per depth on the way down).
void Vocabulary::summarize_subtrees() {
  std::vector<int32_t> parent(num_nodes(), -1), last_at_depth;
  utf8_state_.resize(num_nodes());
  for (int32_t n = 0; n < num_nodes(); ++n) {
    const auto depth = static_cast<size_t>(node_depth_[n]);
    last_at_depth.resize(depth - 1);  // depths 1 .. depth - 1 on the path to n
    if (depth > 1) parent[n] = last_at_depth[depth - 2];
    last_at_depth.push_back(n);
    utf8_state_[n] = utf8_prefix_step(parent[n] < 0 ? 0 : utf8_state_[parent[n]], node_byte_[n]);
  }
  std::vector<ByteSet> below(num_nodes());
  utf8_valid_below_.assign(num_nodes(), 1);
  longest_below_.resize(num_nodes());
  for (int32_t n = 0; n < num_nodes(); ++n) longest_below_[n] = own_tokens_[n] > 0 ? node_depth_[n] : 0;
  for (int32_t n = num_nodes() - 1; n >= 0; --n) {
    if (parent[n] < 0) continue;
    longest_below_[parent[n]] = std::max(longest_below_[parent[n]], longest_below_[n]);
    below[parent[n]] |= below[n];
    below[parent[n]].add(node_byte_[n]);
    if (!utf8_valid_below_[n] || utf8_state_[n] == kUtf8Invalid) utf8_valid_below_[parent[n]] = 0;
  }
  below_index_.assign(num_nodes(), -1);
  for (int32_t n = 0; n < num_nodes(); ++n) {
    if (subtree_end_[n] - n - 1 < kSummarizedDescendants) continue;
    below_index_[n] = static_cast<int32_t>(bytes_below_.size());
    bytes_below_.push_back(below[n]);
  }
  trie_tokens_mask_.assign(mask_words(), 0u);
  for (TokenId id : sorted_) trie_tokens_mask_[id >> 5] |= 1u << (id & 31);
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
  for (const auto& s : state_tokens_) total += s ? s->uncertain.size() : 0;
  return total;
}

namespace {

// Is every token below a trie node accepted from `config`, the node's UTF-8 decoder state being `utf8`? The
// subtree's tokens read only bytes of `below` (bytes_below), each token well-formed UTF-8 from the node on
// (utf8_valid_below), so its paths are among the walks of (decoder state, configuration) pairs over `below`: if
// every pair those walks reach is alive within the frame, so is every token. Two ways to see that, both
// remembered per starting pair:
// - a safe set, found once: bytes such that every well-formed walk over them stays alive (explore the pairs
//   reachable over all bytes; when a walk ends the frame, drop its first byte and explore again). Text and string
//   contents keep all but the bytes that end or escape them, so most subtrees pass by one subset test;
// - otherwise a search of the pairs over `below` itself. The bytes of a walk that ended the frame fail any later
//   `below` holding them all, and a pair whose search found too many pairs (a length-bounded string's counter)
//   is not searched again.
class WholeSubtreeCheck {
 public:
  explicit WholeSubtreeCheck(ConfigurationSpace& space) : space_(space) {}

  bool accepted(int32_t config, uint8_t utf8, const ByteSet& below) {
    auto [it, inserted] = memo_.try_emplace((static_cast<uint64_t>(config) << 8) | utf8);
    Memo& memo = it->second;
    if (inserted) memo.safe = safe_bytes(config, utf8, memo);
    if (subset(below, memo.safe)) return true;
    if (memo.gave_up) return false;
    for (const ByteSet& killer : memo.killers)
      if (subset(killer, below)) return false;
    return search(config, utf8, below, memo);
  }

 private:
  struct Memo {
    ByteSet safe;
    bool gave_up = false;
    std::vector<ByteSet> killers;
  };
  struct Pair {
    uint8_t utf8;
    int32_t config;
    ByteSet path;   // the bytes the walk that found it read
    int16_t first;  // the first of them (-1: the starting pair)
  };
  static constexpr size_t kMaxPairs = 32;
  static constexpr size_t kMaxKillers = 8;

  static bool subset(const ByteSet& a, const ByteSet& b) {
    for (int i = 0; i < 4; ++i)
      if ((a.words[i] & ~b.words[i]) != 0) return false;
    return true;
  }

  // Explores the pairs reachable from (utf8, config) over `bytes`. Returns the first byte of a walk that ended the
  // frame, -1 when none did, -2 when there were too many pairs; a walk that ended the frame is also remembered.
  int explore(int32_t config, uint8_t utf8, const ByteSet& bytes, Memo& memo) {
    Pair pairs[kMaxPairs];
    size_t num_pairs = 1;
    pairs[0] = {utf8, config, ByteSet{}, -1};
    for (size_t done = 0; done < num_pairs; ++done) {
      const Pair from = pairs[done];
      for (int w = 0; w < 4; ++w)
        for (uint64_t word = bytes.words[w]; word != 0; word &= word - 1) {
          const auto byte = static_cast<uint8_t>(w * 64 + std::countr_zero(word));
          const uint8_t to_utf8 = utf8_prefix_step(from.utf8, byte);
          if (to_utf8 == kUtf8Invalid) continue;  // no token reads it here
          ByteSet path = from.path;
          path.add(byte);
          if (!step_alive(from.config, byte)) {
            if (memo.killers.size() < kMaxKillers) memo.killers.push_back(path);
            return from.first < 0 ? byte : from.first;
          }
          const int32_t to_config = space_.step(from.config, byte);
          auto same = [&](const Pair& p) { return p.utf8 == to_utf8 && p.config == to_config; };
          if (std::any_of(pairs, pairs + num_pairs, same)) continue;
          if (num_pairs == kMaxPairs) return -2;
          pairs[num_pairs++] = {to_utf8, to_config, path, from.first < 0 ? static_cast<int16_t>(byte) : from.first};
        }
    }
    return -1;
  }

  ByteSet safe_bytes(int32_t config, uint8_t utf8, Memo& memo) {
    ByteSet allowed;
    for (int b = 0; b < 256; ++b)
      if (utf8_prefix_step(utf8, static_cast<uint8_t>(b)) == kUtf8Invalid || step_alive(config, static_cast<uint8_t>(b)))
        allowed.add(static_cast<uint8_t>(b));
    for (;;) {
      const int killer = explore(config, utf8, allowed, memo);
      if (killer == -1) return allowed;
      if (killer == -2) return ByteSet{};
      allowed.words[killer >> 6] &= ~(uint64_t{1} << (killer & 63));
    }
  }

  bool search(int32_t config, uint8_t utf8, const ByteSet& below, Memo& memo) {
    const int result = explore(config, utf8, below, memo);
    if (result == -2) memo.gave_up = true;
    return result == -1;
  }

  // Does reading `byte` from `config` leave a path alive within the frame? (A byte no stack top reads does not.)
  bool step_alive(int32_t config, uint8_t byte) {
    return space_.at(config).bytes.contains(byte) && space_.at(space_.step(config, byte)).alive_within_frame();
  }

  ConfigurationSpace& space_;
  std::unordered_map<uint64_t, Memo> memo_;
};

// Sorted-index ranges [begin, end), appended in increasing order; adjacent ones merge.
void add_range(std::vector<std::pair<int32_t, int32_t>>& ranges, int32_t begin, int32_t end) {
  if (begin == end) return;
  if (!ranges.empty() && ranges.back().second == begin) ranges.back().second = end;
  else ranges.emplace_back(begin, end);
}

}  // namespace

// One preorder pass over the trie per state that reads bytes, from that state alone over the sentinel;
// a subtree whose prefix is already rejected (or already past the rule's end) is skipped whole, and so is one
// that WholeSubtreeCheck shows to be accepted whole (text, string contents).
void CompiledGrammar::classify_tokens() {
  const Vocabulary& v = *vocabulary_;
  ConfigurationSpace space(tables_);
  WholeSubtreeCheck whole_subtree(space);
  state_tokens_.resize(tables_.num_states);
  // Counted rules classify their states with the count untracked, so two with the same automaton, counting states
  // and FOLLOW set classify alike whatever their bounds (string fields of different maxLength): the first one's
  // classes serve the others.
  std::vector<RuleId> twin(tables_.rule_start.size());
  std::unordered_map<std::string, RuleId> first_with_key;
  for (RuleId rule = 0; rule < static_cast<RuleId>(twin.size()); ++rule) {
    twin[rule] = rule;
    const int32_t begin = tables_.rule_start[rule];
    if (begin < 0 || !tables_.counted(begin)) continue;
    std::string key;
    for (int32_t s = begin; s < tables_.num_states && tables_.rule_of[s] == rule; ++s) {
      for (int b = 0; b < 256; ++b) {
        int32_t t = tables_.next[static_cast<size_t>(s) * 256 + b];
        if (t >= 0) t -= begin;  // relative to the rule's first state
        key.append(reinterpret_cast<const char*>(&t), sizeof t);
      }
      key += static_cast<char>(tables_.accepting[s] | (tables_.counting[s] << 1));
      for (int32_t c = tables_.call_begin[s]; c < tables_.call_begin[s + 1]; ++c) {
        const std::pair<int32_t, int32_t> call = {tables_.calls[c].first, tables_.calls[c].second - begin};
        key.append(reinterpret_cast<const char*>(&call), sizeof call);
      }
      key += '|';
    }
    key.append(reinterpret_cast<const char*>(&tables_.follow[rule]), sizeof(ByteSet));
    key += tables_.count_bounds[rule].second >= 0 ? 'b' : 'u';  // only a bounded rule keeps its tokens' needs
    twin[rule] = first_with_key.try_emplace(std::move(key), rule).first->second;
  }
  // Where each class of twins returns to: the states after its calls, in uncounted rules (their count is unknown to the
  // classification); a class that the root is in, or that returns into a counted rule, gets no list (kUnknownReturns).
  std::vector<std::vector<int32_t>> returns(twin.size());
  std::vector<uint8_t> unknown_returns(twin.size(), 0);
  if (tables_.root_start >= 0) unknown_returns[twin[tables_.rule_of[tables_.root_start]]] = 1;
  for (const auto& [callee, ret] : tables_.calls) {
    const RuleId rule = twin[tables_.rule_of[callee]];
    if (tables_.counted(ret)) unknown_returns[rule] = 1;
    else if (std::find(returns[rule].begin(), returns[rule].end(), ret) == returns[rule].end()) returns[rule].push_back(ret);
  }
  for (RuleId rule = 0; rule < static_cast<RuleId>(twin.size()); ++rule)
    if (unknown_returns[rule]) returns[rule].clear();
  std::vector<int32_t> config_at_depth;
  std::vector<std::pair<int32_t, int32_t>> accepted;
  for (int32_t state = 0; state < tables_.num_states; ++state) {
    const RuleId rule = tables_.rule_of[state];
    if (twin[rule] != rule) {
      state_tokens_[state] = state_tokens_[tables_.rule_start[twin[rule]] + state - tables_.rule_start[rule]];
      continue;
    }
    auto out = std::make_shared<StateTokens>();
    if (tables_.out_bytes[state].empty()) { state_tokens_[state] = std::move(out); continue; }
    accepted.clear();
    config_at_depth.assign(1, space.start(state, kSentinelParent, tables_.counted(state) ? kUncounted : 0));
    for (int32_t n = 0; n < v.num_nodes();) {
      int32_t depth = v.node_depth(n);
      const int32_t from = config_at_depth[depth - 1];
      // A byte no stack top reads ends the frame's paths; only past the rule's end may it still fit (uncertain).
      // Deciding that here saves interning a dead configuration per (configuration, byte).
      if (const auto& f = space.at(from); !f.bytes.contains(v.node_byte(n))) {
        if (f.popped || f.sentinel_follow.contains(v.node_byte(n)))
          for (int32_t i = v.first_token(n); i < v.first_token(v.subtree_end(n)); ++i) out->uncertain.push_back(i);
        n = v.subtree_end(n);
        continue;
      }
      // Counts that cannot reach a bound within the subtree's longest token are dropped, so that configurations
      // differing only in them (a length-bounded string's characters, a counted repetition's) are walked as one.
      int32_t config = space.relax(space.step(from, v.node_byte(n)), v.bytes_after(n));
      const ConfigurationSpace::Configuration& c = space.at(config);
      if (!c.alive_within_frame()) {
        if (c.popped)
          for (int32_t i = v.first_token(n); i < v.first_token(v.subtree_end(n)); ++i) out->uncertain.push_back(i);
        n = v.subtree_end(n);
        continue;
      }
      const ByteSet* below = v.bytes_below(n);
      if (below != nullptr && v.utf8_state(n) != kUtf8Invalid && v.utf8_valid_below(n) &&
          whole_subtree.accepted(config, v.utf8_state(n), *below)) {
        add_range(accepted, v.first_token(n), v.first_token(v.subtree_end(n)));
        n = v.subtree_end(n);
        continue;
      }
      add_range(accepted, v.first_token(n), v.first_token(n) + v.own_tokens(n));
      config_at_depth.resize(depth + 1);
      config_at_depth[depth] = config;
      ++n;
    }
    store_accepted(accepted, *out);
    if (tables_.counted(state) && tables_.count_bounds[rule].second >= 0)
      store_needs(state, accepted, returns[rule], space, *out);
    state_tokens_[state] = std::move(out);
  }
}

// A list costs 4 bytes a token, a bitmask 1 bit: keep whichever is smaller. A bitmask of most of the trie starts
// from all of it and clears the few tokens left out, so its cost follows the smaller side.
void CompiledGrammar::store_accepted(const std::vector<std::pair<int32_t, int32_t>>& ranges, StateTokens& out) const {
  const Vocabulary& v = *vocabulary_;
  int64_t count = 0;
  for (auto [begin, end] : ranges) count += end - begin;
  auto flip = [&](std::vector<uint32_t>& mask, int32_t begin, int32_t end) {
    for (int32_t i = begin; i < end; ++i) mask[v.sorted(i) >> 5] ^= 1u << (v.sorted(i) & 31);
  };
  if (count * 32 <= v.size()) {
    for (auto [begin, end] : ranges)
      for (int32_t i = begin; i < end; ++i) out.accepted_ids.push_back(v.sorted(i));
  } else if (count * 2 <= v.num_sorted()) {
    out.accepted_mask.assign(v.mask_words(), 0u);
    for (auto [begin, end] : ranges) flip(out.accepted_mask, begin, end);
  } else {
    out.accepted_mask = v.trie_tokens_mask();
    int32_t at = 0;
    for (auto [begin, end] : ranges) {
      flip(out.accepted_mask, at, begin);
      at = end;
    }
    flip(out.accepted_mask, at, v.num_sorted());
  }
}

namespace {

// (need, k, index in byte order) sorted by need, then k, byte order kept within each: two stable counting sorts (needs
// and k are small integers, k <= need <= largest).
void store_leaving(const std::vector<std::array<int32_t, 3>>& entries, int32_t largest,
                   CompiledGrammar::StateTokens::LeavingTokens& out) {
  std::vector<std::array<int32_t, 3>> by_k(entries.size());
  std::vector<int32_t> next(static_cast<size_t>(largest) + 2, 0);
  for (const auto& e : entries) ++next[e[1] + 1];
  for (size_t k = 1; k < next.size(); ++k) next[k] += next[k - 1];
  for (const auto& e : entries) by_k[next[e[1]]++] = e;
  out.begin.assign(static_cast<size_t>(largest) + 2, 0);
  for (const auto& e : by_k) ++out.begin[e[0] + 1];
  for (size_t k = 1; k < out.begin.size(); ++k) out.begin[k] += out.begin[k - 1];
  out.index.resize(entries.size());
  out.k.resize(entries.size());
  next.assign(out.begin.begin(), out.begin.end() - 1);
  for (const auto& e : by_k) {
    out.index[next[e[0]]] = e[2];
    out.k[next[e[0]]++] = e[1];
  }
}

}  // namespace

std::span<const int32_t> CompiledGrammar::StateTokens::LeavingTokens::within(int32_t need, int32_t budget) const {
  if (need < 0 || static_cast<size_t>(need) + 1 >= begin.size()) return {};
  const auto first = k.begin() + begin[need], last = k.begin() + begin[need + 1];
  return std::span<const int32_t>(index).subspan(begin[need], std::upper_bound(first, last, budget) - first);
}

// Walks the trie in preorder through the subtrees that hold accepted tokens (one step per trie node, shared by the
// tokens below it), noting each accepted token's need. A call-free rule is walked through its automaton: (state,
// counts so far) per depth; a rule that calls others (a repetition of `, item`) through the configurations from its
// state with the count tallied, and a token's need is the least over the stacks it leaves of the frame's tally plus
// shortest[] of the frame's state. The paths that leave a call-free frame are followed beside it: per depth, each
// leaving point's k and the configuration its rest reaches from each state in `returns` (empty: where the frame returns
// is not known here, and every leaving path is walked at run time).
void CompiledGrammar::store_needs(int32_t state, const std::vector<std::pair<int32_t, int32_t>>& ranges,
                                  const std::vector<int32_t>& returns, ConfigurationSpace& space, StateTokens& out) const {
  const Vocabulary& v = *vocabulary_;
  const RuleId rule = tables_.rule_of[state];
  bool calls = false;
  for (int32_t s = tables_.rule_start[rule]; s < tables_.num_states && tables_.rule_of[s] == rule; ++s)
    calls = calls || tables_.call_begin[s] < tables_.call_begin[s + 1];
  auto need_of_stacks = [&](int32_t config) {
    int32_t need = INT32_MAX;
    for (int32_t n : space.at(config).nodes) {
      while (space.parent_of(n) != kSentinelParent) n = space.parent_of(n);
      need = std::min(need, tally_of(space.count_of(n)) + tables_.shortest[space.state_of(n)]);
    }
    require(need != INT32_MAX, "grammar: an accepted token leaves no stack in a counted rule's frame");
    return need;
  };
  // Per depth: call-free, (automaton state, counts so far); with calls, (configuration, 0), whose popped flag says
  // whether a path may have left the frame (ended it where the next byte can follow the rule).
  std::vector<std::pair<int32_t, int32_t>> path = {{calls ? space.start(state, kSentinelParent, tallied(0)) : state, 0}};
  std::vector<uint8_t> popped = {0};
  // Call-free, per depth: the leaving points still alive, `width` entries each: k, then one configuration per return
  // state. Points with the same configurations keep the least k; a point whose rest died in every returning rule goes.
  const size_t width = 1 + returns.size();
  std::vector<std::vector<int32_t>> leaves(1);
  std::vector<int32_t> starts, stepped(returns.size());
  for (int32_t r : returns) starts.push_back(space.start(r, kSentinelParent));
  auto add_leave = [&](std::vector<int32_t>& to, int32_t k) {
    bool alive = returns.empty();
    for (int32_t c : stepped) alive = alive || space.at(c).alive_within_frame() || space.at(c).popped;
    if (!alive) return;
    for (size_t at = 0; at < to.size(); at += width)
      if (std::equal(stepped.begin(), stepped.end(), to.begin() + static_cast<std::ptrdiff_t>(at) + 1)) {
        to[at] = std::min(to[at], k);
        return;
      }
    to.push_back(k);
    to.insert(to.end(), stepped.begin(), stepped.end());
  };
  const ByteSet& follow = tables_.follow[rule];
  std::vector<std::pair<int32_t, TokenId>> needs;
  std::vector<std::array<int32_t, 3>> sure, walk;  // (need, k, index in byte order)
  size_t r = 0;  // the first range that does not end before the current node's tokens
  for (int32_t n = 0; n < v.num_nodes();) {
    const int32_t first = v.first_token(n), after = v.first_token(v.subtree_end(n));
    while (r < ranges.size() && ranges[r].second <= first) ++r;
    if (r == ranges.size()) break;
    if (ranges[r].first >= after) {  // nothing accepted below n
      n = v.subtree_end(n);
      continue;
    }
    const int32_t depth = v.node_depth(n);
    const uint8_t byte = v.node_byte(n);
    const auto [at, counts] = path[depth - 1];
    path.resize(depth);
    popped.resize(depth);
    if (calls) {
      path.emplace_back(space.step(at, byte), 0);
      popped.push_back(space.at(path.back().first).popped);
    } else {
      const int32_t to = tables_.next[static_cast<size_t>(at) * 256 + byte];
      require(to >= 0, "grammar: an accepted token leaves a counted rule's automaton");
      path.emplace_back(to, counts + tables_.counting[at]);
      if (leaves.size() <= static_cast<size_t>(depth)) leaves.resize(depth + 1);
      const std::vector<int32_t>& before = leaves[depth - 1];
      std::vector<int32_t>& here = leaves[depth];
      here.clear();
      for (size_t p = 0; p < before.size(); p += width) {
        for (size_t i = 0; i < returns.size(); ++i) stepped[i] = space.step(before[p + 1 + i], byte);
        add_leave(here, before[p]);
      }
      if (tables_.accepting[at] && follow.contains(byte)) {  // the frame may end here, the byte read after it
        for (size_t i = 0; i < returns.size(); ++i) stepped[i] = space.step(starts[i], byte);
        add_leave(here, counts);
      }
    }
    for (int32_t i = first; i < first + v.own_tokens(n); ++i) {
      while (r < ranges.size() && ranges[r].second <= i) ++r;
      if (r == ranges.size() || i < ranges[r].first) continue;
      const auto [to, to_counts] = path.back();
      const int32_t need = calls ? need_of_stacks(to) : to_counts + tables_.shortest[to];
      needs.emplace_back(need, v.sorted(i));
      if (calls) {
        if (popped.back()) walk.push_back({need, 0, i});
        continue;
      }
      int32_t sure_k = INT32_MAX, walk_k = INT32_MAX;
      const std::vector<int32_t>& here = leaves[depth];
      for (size_t p = 0; p < here.size(); p += width) {
        bool all_alive = !returns.empty();
        for (size_t j = 0; j < returns.size(); ++j) all_alive = all_alive && space.at(here[p + 1 + j]).alive_within_frame();
        int32_t& k = all_alive ? sure_k : walk_k;
        k = std::min(k, here[p]);
      }
      if (sure_k != INT32_MAX) sure.push_back({need, sure_k, i});
      if (walk_k < sure_k) walk.push_back({need, walk_k, i});
    }
    ++n;
  }
  // Needs are small (at most a token's length plus the rule's shortest end): a counting sort.
  int32_t largest = 0;
  for (const auto& [need, token] : needs) largest = std::max(largest, need);
  out.need_begin.assign(static_cast<size_t>(largest) + 2, 0);
  for (const auto& [need, token] : needs) ++out.need_begin[need + 1];
  for (size_t k = 1; k < out.need_begin.size(); ++k) out.need_begin[k] += out.need_begin[k - 1];
  out.by_need.resize(needs.size());
  std::vector<int32_t> next(out.need_begin.begin(), out.need_begin.end() - 1);
  for (const auto& [need, token] : needs) out.by_need[next[need]++] = token;
  store_leaving(sure, largest, out.sure);
  store_leaving(walk, largest, out.walk);
}

// Near its bound, a counted frame allows the tokens of small need: set the few that are, or copy the whole set and
// clear the few that are not, whichever touches fewer tokens.
void CompiledGrammar::add_accepted(int32_t state, int32_t budget, std::span<uint32_t> mask,
                                   std::vector<uint32_t>& scratch) const {
  const StateTokens& tokens = *state_tokens_[state];
  const Vocabulary& v = *vocabulary_;
  const bool filtered = !tokens.need_begin.empty() && budget < tokens.max_need();
  if (filtered && budget >= 0) {
    const auto split = static_cast<size_t>(tokens.need_begin[budget + 1]);
    if (split * 2 <= tokens.by_need.size() || tokens.accepted_mask.empty()) {
      for (size_t i = 0; i < split; ++i) mask[tokens.by_need[i] >> 5] |= 1u << (tokens.by_need[i] & 31);
      return;
    }
    scratch = tokens.accepted_mask;
    for (size_t i = split; i < tokens.by_need.size(); ++i)
      scratch[tokens.by_need[i] >> 5] &= ~(1u << (tokens.by_need[i] & 31));
    for (int32_t w = 0; w < v.mask_words(); ++w) mask[w] |= scratch[w];
    return;
  }
  if (filtered) return;  // a negative budget: the frame has no room for any count
  if (!tokens.accepted_mask.empty()) {
    for (int32_t w = 0; w < v.mask_words(); ++w) mask[w] |= tokens.accepted_mask[w];
  } else {
    for (TokenId t : tokens.accepted_ids) mask[t >> 5] |= 1u << (t & 31);
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

std::vector<TokenId> GrammarMatcher::jump_forward_tokens(const Tokenizer& tokenizer, size_t max_tokens) {
  const std::string forced = jump_forward_bytes();
  const Vocabulary& v = *grammar_->vocabulary();
  std::vector<TokenId> tokens;
  size_t text_begin = 0;
  bool ends_in_text = false;
  for (size_t i = 0; i <= forced.size() && tokens.size() <= max_tokens; ++i) {
    const TokenId special = i < forced.size() ? v.single_byte_token(static_cast<uint8_t>(forced[i])) : -1;
    const bool is_special = special >= 0 && tokenizer.is_special(special);
    if (i < forced.size() && !is_special) continue;
    const std::vector<TokenId> text = tokenizer.encode(std::string_view(forced).substr(text_begin, i - text_begin));
    tokens.insert(tokens.end(), text.begin(), text.end());
    ends_in_text = !is_special && !text.empty();
    if (is_special) tokens.push_back(special);
    text_begin = i + 1;
  }
  if (ends_in_text) tokens.pop_back();
  if (tokens.size() > max_tokens) tokens.resize(max_tokens);
  size_t taken = 0;
  while (taken < tokens.size() && accept_token(tokens[taken])) ++taken;
  rollback(static_cast<int32_t>(taken));
  tokens.resize(taken);
  return tokens;
}

void GrammarMatcher::fill_next_token_mask(std::span<uint32_t> mask) {
  const Vocabulary& v = *grammar_->vocabulary();
  require(mask.size() >= static_cast<size_t>(v.mask_words()), "grammar matcher: mask of {} words, need {}",
          mask.size(), v.mask_words());
  std::fill(mask.begin(), mask.end(), 0u);
  if (terminated()) return;
  int32_t config = history_.back();
  const auto& c = space_.at(config);
  // Stack tops in one state share their precomputed sets (and, in a bounded counted rule, their budget: the bound
  // less the frame's count); nodes are sorted by id, not state, so dedupe.
  const PushdownTables& tables = grammar_->tables();
  std::vector<std::pair<int32_t, int32_t>>& tops = tops_;
  tops.clear();
  for (int32_t node : c.nodes) {
    const int32_t state = space_.state_of(node);
    int32_t budget = INT32_MAX;
    if (tables.counted(state)) {
      const int32_t max = tables.count_bounds[tables.rule_of[state]].second;
      if (max >= 0) budget = max - space_.count_of(node);
    }
    if (std::find(tops.begin(), tops.end(), std::pair{state, budget}) == tops.end()) tops.emplace_back(state, budget);
  }
  for (auto [state, budget] : tops) grammar_->add_accepted(state, budget, mask, scratch_);
  // Uncertain tokens are walked through the real configuration, so one walk per state covers every budget. A counted
  // frame's accepted tokens over its budget are still allowed where they may leave the frame within it (its count at
  // least the rule's minimum once they leave): the sure ones are set, the others walked, as are the sure ones while
  // the count is below the minimum (k more counts may not reach it).
  for (size_t i = 0; i < tops.size(); ++i) {
    const auto [state, budget] = tops[i];
    bool walked = false;
    for (size_t j = 0; j < i && !walked; ++j) walked = tops[j].first == state;
    const CompiledGrammar::StateTokens& tokens = grammar_->state_tokens(state);
    if (!walked) walk_uncertain(tokens.uncertain, config, mask);
    if (budget >= tokens.max_need()) continue;
    const auto [min, max] = tables.count_bounds[tables.rule_of[state]];
    const bool at_least_min = max - budget >= min;
    for (int32_t need = std::max(budget + 1, 0); need <= tokens.max_need(); ++need) {
      const std::span<const int32_t> sure = tokens.sure.within(need, budget);
      if (at_least_min) {
        for (int32_t index : sure) mask[v.sorted(index) >> 5] |= 1u << (v.sorted(index) & 31);
      } else {
        walk_uncertain(sure, config, mask);
      }
      walk_uncertain(tokens.walk.within(need, budget), config, mask);
    }
  }
  // Not through `c`: walking the uncertain tokens may intern configurations, which moves them.
  if (space_.at(config).can_end)
    for (TokenId t : grammar_->stop_tokens()) mask[t >> 5] |= 1u << (t & 31);
}

// The uncertain tokens are in byte order, so each walk resumes from the longest prefix it shares with the
// previous token (a trie walk restricted to them).
void GrammarMatcher::walk_uncertain(std::span<const int32_t> uncertain, int32_t config, std::span<uint32_t> mask) {
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
