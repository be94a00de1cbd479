#include "structured/pushdown.h"

#include <algorithm>
#include <cstring>

namespace beamline {

PushdownTables PushdownTables::build(const Grammar& grammar) {
  std::vector<Automaton> rules = grammar.compile_rules();
  require(grammar.root() >= 0, "grammar: no root rule");
  PushdownTables t;
  std::vector<int32_t> offset(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    offset[r] = t.num_states;
    t.rule_start.push_back(rules[r].num_states > 0 ? t.num_states : -1);
    t.num_states += rules[r].num_states;
  }
  if (t.rule_start[grammar.root()] < 0) refuse("grammar", "no output satisfies it (its language is empty)");
  t.root_start = t.rule_start[grammar.root()];
  t.next.assign(static_cast<size_t>(t.num_states) * 256, -1);
  t.accepting.resize(t.num_states);
  t.rule_of.resize(t.num_states);
  t.out_bytes.resize(t.num_states);
  t.call_begin.push_back(0);
  for (size_t r = 0; r < rules.size(); ++r) {
    const Automaton& a = rules[r];
    for (int32_t s = 0; s < a.num_states; ++s) {
      int32_t g = offset[r] + s;
      t.accepting[g] = a.accepting[s];
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
  t.follow.assign(rules.size(), ByteSet{});
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

int32_t ConfigurationSpace::node(int32_t state, int32_t parent) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = node_index_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) {
    nodes_.emplace_back(state, parent);
    visit_stamp_.push_back(0);
  }
  return it->second;
}

int32_t ConfigurationSpace::start(int32_t state, int32_t parent) { return close({node(state, parent)}, false); }

int32_t ConfigurationSpace::compute_step(int32_t config, uint8_t byte) {
  const Configuration& c = configs_[config];
  bool popped = c.popped || c.sentinel_follow.contains(byte);
  std::vector<int32_t> seeds;
  for (int32_t n : c.nodes) {
    auto [state, parent] = nodes_[n];
    int32_t to = tables_.next[static_cast<size_t>(state) * 256 + byte];
    if (to >= 0) seeds.push_back(node(to, parent));
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
    auto [state, parent] = nodes_[n];
    if (!tables_.out_bytes[state].empty()) {
      out.nodes.push_back(n);
      out.bytes |= tables_.out_bytes[state];
    }
    for (int32_t c = tables_.call_begin[state]; c < tables_.call_begin[state + 1]; ++c) {
      auto [callee, ret] = tables_.calls[c];
      int32_t return_node = node(ret, parent);
      int32_t pushed = node(callee, return_node);
      work.push_back(pushed);
    }
    if (tables_.accepting[state]) {
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
