#include "structured/pushdown.h"

#include <algorithm>
#include <cstring>

namespace beamline {

PushdownTables PushdownTables::build(const Grammar& grammar) {
  std::vector<RuleAutomaton> compiled = grammar.compile_rules();
  require(grammar.root() >= 0, "grammar: no root rule");
  PushdownTables t;
  std::vector<int32_t> offset(compiled.size());
  for (size_t r = 0; r < compiled.size(); ++r) {
    offset[r] = t.num_states;
    t.rule_start.push_back(compiled[r].automaton.num_states > 0 ? t.num_states : -1);
    t.num_states += compiled[r].automaton.num_states;
    t.rule_counted.push_back(compiled[r].counted);
    t.count_bounds.emplace_back(compiled[r].min_count, compiled[r].max_count);
  }
  if (t.rule_start[grammar.root()] < 0) refuse("grammar", "no output satisfies it (its language is empty)");
  t.root_start = t.rule_start[grammar.root()];
  t.next.assign(static_cast<size_t>(t.num_states) * 256, -1);
  t.accepting.resize(t.num_states);
  t.rule_of.resize(t.num_states);
  t.out_bytes.resize(t.num_states);
  t.counting.assign(t.num_states, 0);
  t.shortest.assign(t.num_states, 0);
  t.rule_longest_shortest.assign(compiled.size(), 0);
  t.call_begin.push_back(0);
  for (size_t r = 0; r < compiled.size(); ++r) {
    const Automaton& a = compiled[r].automaton;
    for (int32_t s = 0; s < a.num_states; ++s) {
      int32_t g = offset[r] + s;
      t.accepting[g] = a.accepting[s];
      if (compiled[r].counted) {
        t.counting[g] = compiled[r].counting[s];
        t.shortest[g] = compiled[r].shortest[s];
        if (t.shortest[g] != INT32_MAX)
          t.rule_longest_shortest[r] = std::max(t.rule_longest_shortest[r], t.shortest[g]);
      }
      t.rule_of[g] = static_cast<RuleId>(r);
      for (int b = 0; b < 256; ++b) {
        int32_t to = a.step(s, static_cast<uint8_t>(b));
        if (to < 0) continue;
        t.next[static_cast<size_t>(g) * 256 + b] = offset[r] + to;
        t.out_bytes[g].add(static_cast<uint8_t>(b));
      }
      for (auto [callee, to] : a.calls[s]) t.calls.emplace_back(t.rule_start[callee], offset[r] + to);
      t.call_begin.push_back(static_cast<int32_t>(t.calls.size()));
    }
  }
  // FOLLOW sets by fixpoint: what a state can read first (through calls and, at a rule's end, what follows
  // the rule), and for each call, what the return state can read first follows the callee.
  std::vector<ByteSet> first(t.num_states);
  std::vector<uint8_t> nullable(t.num_states, 0);
  t.follow.assign(compiled.size(), ByteSet{});
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < t.num_states; ++s) {
      ByteSet f = t.out_bytes[s];
      bool null = t.accepting[s];
      if (t.accepting[s]) f |= t.follow[t.rule_of[s]];
      for (int32_t c = t.call_begin[s]; c < t.call_begin[s + 1]; ++c) {
        auto [callee, ret] = t.calls[c];
        f |= first[callee];
        if (nullable[callee]) { f |= first[ret]; null = null || nullable[ret]; }
        ByteSet& follow = t.follow[t.rule_of[callee]];
        ByteSet before = follow;
        follow |= first[ret];
        if (!(before == follow)) changed = true;
      }
      if (!(f == first[s]) || null != static_cast<bool>(nullable[s])) {
        first[s] = f;
        nullable[s] = null;
        changed = true;
      }
    }
  }
  return t;
}

ConfigurationSpace::ConfigurationSpace(const PushdownTables& tables) : tables_(tables) {
  intern(Configuration{});  // kDead
}

int32_t ConfigurationSpace::node(int32_t state, int32_t parent, int32_t count) {
  const Node key{state, parent, count};
  auto [it, inserted] = node_index_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) {
    nodes_.push_back(key);
    visit_stamp_.push_back(0);
  }
  return it->second;
}

int32_t ConfigurationSpace::start(int32_t state, int32_t parent, int32_t count) {
  return close({node(state, parent, count)}, false);
}

// A counting state whose frame has used up its bound reads nothing more (its rule may still end).
bool ConfigurationSpace::readable(const Node& n) const {
  if (tables_.out_bytes[n.state].empty()) return false;
  if (!tables_.counting[n.state] || n.count < 0) return true;  // uncounted or tallied
  const int32_t max = tables_.count_bounds[tables_.rule_of[n.state]].second;
  return max < 0 || n.count < max;
}

int32_t ConfigurationSpace::relax(int32_t config, int32_t horizon) {
  auto relaxable = [&](int32_t n) {
    const Node& at = nodes_[n];
    if (at.count < 0 || !tables_.counted(at.state)) return false;
    const RuleId rule = tables_.rule_of[at.state];
    const auto [min, max] = tables_.count_bounds[rule];
    return at.count >= min &&
           (max < 0 || int64_t{at.count} + horizon + tables_.rule_longest_shortest[rule] <= max);
  };
  const Configuration& c = configs_[config];
  if (std::none_of(c.nodes.begin(), c.nodes.end(), relaxable)) return config;
  const uint64_t key = (static_cast<uint64_t>(config) << 32) | static_cast<uint32_t>(horizon);
  if (auto it = relaxed_.find(key); it != relaxed_.end()) return it->second;
  Configuration out = c;
  for (int32_t& n : out.nodes)
    if (relaxable(n)) n = node(nodes_[n].state, nodes_[n].parent, kUncounted);
  std::sort(out.nodes.begin(), out.nodes.end());
  out.nodes.erase(std::unique(out.nodes.begin(), out.nodes.end()), out.nodes.end());
  const int32_t relaxed = intern(std::move(out));
  relaxed_.emplace(key, relaxed);
  return relaxed;
}

int32_t ConfigurationSpace::compute_step(int32_t config, uint8_t byte) {
  const Configuration& c = configs_[config];
  bool popped = c.popped || c.sentinel_follow.contains(byte);
  std::vector<int32_t> seeds;
  for (int32_t n : c.nodes) {
    const Node from = nodes_[n];
    int32_t to = tables_.next[static_cast<size_t>(from.state) * 256 + byte];
    if (to < 0) continue;
    int32_t count = from.count;
    if (tables_.counted(from.state) && count < kUncounted) {
      if (tables_.counting[from.state]) --count;  // tallied: one more count, no bound
    } else if (tables_.counted(from.state) && count != kUncounted) {
      // Counts past the largest that matters are alike (min when unbounded), so an unbounded frame stays finite.
      const auto [min, max] = tables_.count_bounds[tables_.rule_of[from.state]];
      if (tables_.counting[from.state]) count = max >= 0 ? count + 1 : std::min(count + 1, min);
      if (max >= 0 && tables_.shortest[to] > max - count) continue;  // no end would be left within the bound
    }
    seeds.push_back(node(to, from.parent, count));
  }
  return close(std::move(seeds), popped);
}

// Follows calls (push the callee's start over the return state) and rule ends (continue in the parent)
// until every stack top can read a byte or has ended at the root or the sentinel.
int32_t ConfigurationSpace::close(std::vector<int32_t> work, bool popped) {
  Configuration out;
  out.popped = popped;
  ++stamp_;
  while (!work.empty()) {
    int32_t n = work.back();
    work.pop_back();
    if (visit_stamp_[n] == stamp_) continue;
    visit_stamp_[n] = stamp_;
    const Node at = nodes_[n];
    const auto [state, parent, count] = at;
    if (readable(at)) {
      out.nodes.push_back(n);
      out.bytes |= tables_.out_bytes[state];
    }
    for (int32_t c = tables_.call_begin[state]; c < tables_.call_begin[state + 1]; ++c) {
      auto [callee, ret] = tables_.calls[c];
      int32_t return_node = node(ret, parent, count);
      int32_t pushed = node(callee, return_node, 0);
      work.push_back(pushed);
    }
    const bool may_end = !tables_.counted(state) || count < 0 ||
                         count >= tables_.count_bounds[tables_.rule_of[state]].first;
    if (tables_.accepting[state] && may_end) {
      if (parent == kRootParent) out.can_end = true;
      else if (parent == kSentinelParent) {
        out.at_sentinel = true;
        out.sentinel_follow |= tables_.follow[tables_.rule_of[state]];
      }
      else work.push_back(parent);
    }
  }
  std::sort(out.nodes.begin(), out.nodes.end());
  return intern(std::move(out));
}

int32_t ConfigurationSpace::intern(Configuration config) {
  std::string key(config.nodes.size() * sizeof(int32_t) + 1 + sizeof(ByteSet), '\0');
  std::memcpy(key.data(), config.nodes.data(), config.nodes.size() * sizeof(int32_t));
  key[config.nodes.size() * sizeof(int32_t)] = static_cast<char>(config.can_end | (config.popped << 1) | (config.at_sentinel << 2));
  std::memcpy(key.data() + config.nodes.size() * sizeof(int32_t) + 1, &config.sentinel_follow, sizeof(ByteSet));
  auto [it, inserted] = config_index_.emplace(std::move(key), static_cast<int32_t>(configs_.size()));
  if (inserted) {
    configs_.push_back(std::move(config));
    transitions_.resize(configs_.size() * 256, kUnknown);
  }
  return it->second;
}

}  // namespace beamline
