#pragma once
// The byte-level pushdown matcher. A grammar's rule automata are laid out in one state space; a parse
// position is a stack of states (a node: state + parent node, shared between stacks), and because a grammar
// may be ambiguous the matcher tracks a set of stacks at once. Such a set, closed under rule calls and
// returns, is a configuration; configurations are interned and their byte transitions cached, so the
// matcher is a lazily built DFA over configurations: walking a token is one table lookup per byte once warm.
// A node of a counted rule also holds the frame's count, so a bound costs configurations only as far as an
// output actually counts, never states in the tables.
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"

namespace beamline {

// The rule automata of a grammar in one state space (state ids are global across rules).
struct PushdownTables {
  int32_t num_states = 0;
  std::vector<int32_t> next;                          // [state * 256 + byte] -> state, -1 none
  std::vector<uint8_t> accepting;                     // the state may end its rule
  std::vector<int32_t> call_begin;                    // calls of state s: [call_begin[s], call_begin[s + 1])
  std::vector<std::pair<int32_t, int32_t>> calls;     // (callee's start state, state to return to)
  std::vector<RuleId> rule_of;
  std::vector<int32_t> rule_start;                    // -1 for a rule with an empty language
  std::vector<ByteSet> out_bytes;                     // bytes with an edge out of the state
  std::vector<ByteSet> follow;                        // per rule: bytes that can come right after it ends
  int32_t root_start = -1;
  // Counted rules (RuleAutomaton): per state, whether a byte read there is counted and the fewest counts to the
  // rule's end; per rule, its bounds (max -1: unbounded; a rule without a counter has 0..-1 and no counting states).
  std::vector<uint8_t> counting;
  std::vector<int32_t> shortest;
  std::vector<std::pair<int32_t, int32_t>> count_bounds;
  bool counted(int32_t state) const { return rule_counted[rule_of[state]] != 0; }
  std::vector<uint8_t> rule_counted;
  std::vector<int32_t> rule_longest_shortest;  // per rule: the largest shortest[] of its states (0 uncounted)

  // Throws UnsupportedGrammar("grammar", ...) when no string matches the root rule.
  static PushdownTables build(const Grammar& grammar);
};

// A counted frame's count while classifying tokens against one frame: not tracked (nothing is over a bound, the
// frame may end), so the classification holds for every count; the token masks add the bound per count.
inline constexpr int32_t kUncounted = -1;
// A counted frame's count when only the counts read matter, not the bounds: tallied(k) after k counts (k >= 0), every
// bound ignored. Token classification notes with it how many counts each accepted token reads.
inline constexpr int32_t tallied(int32_t counts) { return -2 - counts; }
inline constexpr int32_t tally_of(int32_t count) { return -2 - count; }

// Where a stack ends below its first frame: the root (the grammar is complete when it pops there), or the
// sentinel used when classifying tokens against one frame with its context unknown.
inline constexpr int32_t kRootParent = -1;
inline constexpr int32_t kSentinelParent = -2;

class ConfigurationSpace {
 public:
  struct Configuration {
    std::vector<int32_t> nodes;  // stack tops that can read a byte, sorted
    ByteSet bytes;               // union of their out_bytes
    bool can_end = false;        // some stack popped to the root: the output may stop here
    bool popped = false;         // some path read a byte past the sentinel (classification only)
    bool at_sentinel = false;    // a stack popped to the sentinel: the classified frame's rule has ended
    ByteSet sentinel_follow;     // what could follow that rule
    bool alive() const { return !nodes.empty() || can_end; }
    bool alive_within_frame() const { return !nodes.empty() || at_sentinel; }
  };
  static constexpr int32_t kDead = 0;

  explicit ConfigurationSpace(const PushdownTables& tables);
  int32_t start(int32_t state, int32_t parent, int32_t count = 0);  // the closure of one stack
  int32_t step(int32_t config, uint8_t byte) {
    const size_t at = static_cast<size_t>(config) * 256 + byte;
    if (transitions_[at] == kUnknown) {
      // Not through a reference taken before: computing may intern a configuration, which grows transitions_.
      const int32_t to = compute_step(config, byte);
      transitions_[at] = to;
    }
    return transitions_[at];
  }
  // `config` with every stack top whose count cannot matter within the next `horizon` bytes made uncounted
  // (kUncounted): a frame that has reached its minimum and stays within its maximum whatever `horizon` more counts
  // it reads (count + horizon + the rule's largest shortest[] <= max, or no maximum). Walks of at most `horizon`
  // bytes from the result reach what walks from `config` reach, while configurations that differ only in such
  // counts become one: token classification relaxes a trie node's configuration by the longest token below it.
  int32_t relax(int32_t config, int32_t horizon);
  int32_t walk(int32_t config, std::string_view bytes) {
    for (char c : bytes) {
      if (config == kDead) return kDead;
      config = step(config, static_cast<uint8_t>(c));
    }
    return config;
  }
  const Configuration& at(int32_t config) const { return configs_[config]; }
  int32_t state_of(int32_t node) const { return nodes_[node].state; }
  int32_t count_of(int32_t node) const { return nodes_[node].count; }
  int32_t parent_of(int32_t node) const { return nodes_[node].parent; }

 private:
  static constexpr int32_t kUnknown = -2;
  struct Node {
    int32_t state, parent, count;
    bool operator==(const Node&) const = default;
  };
  struct NodeHash {
    size_t operator()(const Node& n) const {
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(n.state)) << 32) | static_cast<uint32_t>(n.parent);
      return std::hash<uint64_t>()(key * 0x9E3779B97F4A7C15ull ^ static_cast<uint32_t>(n.count));
    }
  };
  int32_t node(int32_t state, int32_t parent, int32_t count);
  bool readable(const Node& n) const;
  int32_t compute_step(int32_t config, uint8_t byte);
  int32_t close(std::vector<int32_t> seeds, bool popped);
  int32_t intern(Configuration config);

  const PushdownTables& tables_;
  std::vector<Node> nodes_;
  std::unordered_map<Node, int32_t, NodeHash> node_index_;
  std::vector<Configuration> configs_;
  std::unordered_map<std::string, int32_t> config_index_;
  std::vector<int32_t> transitions_;
  std::vector<uint32_t> visit_stamp_;
  uint32_t stamp_ = 0;
  std::unordered_map<uint64_t, int32_t> relaxed_;  // (config, horizon) -> relax()'s result
};

}  // namespace beamline
