#include "structured/grammar.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <climits>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace beamline {

int ByteSet::count() const {
  int total = 0;
  for (uint64_t word : words) total += std::popcount(word);
  return total;
}

int32_t Automaton::add_state() {
  next.resize(next.size() + 256, -1);
  accepting.push_back(0);
  calls.emplace_back();
  return num_states++;
}

bool Automaton::has_calls() const {
  return std::any_of(calls.begin(), calls.end(), [](const auto& list) { return !list.empty(); });
}

bool Automaton::matches(std::string_view bytes) const {
  if (num_states == 0) return false;
  int32_t state = 0;
  for (char c : bytes) {
    state = step(state, static_cast<uint8_t>(c));
    if (state < 0) return false;
  }
  return accepting[state] != 0;
}

namespace {

// Thompson construction: expressions become NFA fragments with epsilon edges; determinize() removes them.
struct Nfa {
  struct State {
    std::vector<int32_t> epsilon;
    std::vector<std::pair<ByteSet, int32_t>> byte_edges;
    std::vector<std::pair<RuleId, int32_t>> call_edges;
  };
  std::vector<State> states;
  int32_t add() { states.emplace_back(); return static_cast<int32_t>(states.size()) - 1; }
};

// Counted repetitions found while building rule bodies, each to become a rule of its own (ids from `first_rule`).
struct Lifted {
  RuleId first_rule = 0;
  std::vector<ExprId> exprs;  // kCounted, or a kRepeat that the matcher counts
  RuleId add(ExprId id) {
    exprs.push_back(id);
    return first_rule + static_cast<RuleId>(exprs.size()) - 1;
  }
};

bool large_repeat(const Grammar::Expr& e) {
  return (e.max_count < 0 ? e.min_count : e.max_count) > Grammar::kUnrolledRepeats;
}

int32_t build_fragment(const Grammar& grammar, Nfa& nfa, ExprId id, int32_t from, Lifted* lifted);

// The body of a counted repetition: `child` repeated any number of times.
Automaton repetition_loop(const Grammar& grammar, ExprId child);
bool countable_repetition(const Grammar& grammar, const Grammar::Expr& e);

int32_t build_fragment(const Grammar& grammar, Nfa& nfa, ExprId id, int32_t from, Lifted* lifted) {
  using Kind = Grammar::Expr::Kind;
  const Grammar::Expr& e = grammar.expr(id);
  switch (e.kind) {
    case Kind::kEmpty: return from;
    case Kind::kNothing: return nfa.add();  // unreachable end
    case Kind::kBytes: {
      int32_t to = nfa.add();
      nfa.states[from].byte_edges.emplace_back(e.bytes, to);
      return to;
    }
    case Kind::kRule: {
      int32_t to = nfa.add();
      nfa.states[from].call_edges.emplace_back(e.index, to);
      return to;
    }
    case Kind::kSequence: {
      int32_t at = from;
      for (ExprId child : e.children) at = build_fragment(grammar, nfa, child, at, lifted);
      return at;
    }
    case Kind::kChoice: {
      int32_t end = nfa.add();
      for (ExprId child : e.children) {
        int32_t start = nfa.add();
        nfa.states[from].epsilon.push_back(start);
        nfa.states[build_fragment(grammar, nfa, child, start, lifted)].epsilon.push_back(end);
      }
      return end;
    }
    case Kind::kCounted:
    case Kind::kRepeat: {
      const bool count =
          lifted != nullptr && (e.kind == Kind::kCounted || (large_repeat(e) && countable_repetition(grammar, e)));
      if (count) {  // a rule of its own, whose frame holds the count
        int32_t to = nfa.add();
        nfa.states[from].call_edges.emplace_back(lifted->add(id), to);
        return to;
      }
      require(e.unit == CountUnit::kRepetition, "grammar: a length-bounded string inside a regular expression");
      int32_t at = from;
      for (int32_t i = 0; i < e.min_count; ++i) at = build_fragment(grammar, nfa, e.children[0], at, lifted);
      if (e.max_count < 0) {  // a loop state: enter, match the child, come back
        int32_t loop = nfa.add();
        nfa.states[at].epsilon.push_back(loop);
        nfa.states[build_fragment(grammar, nfa, e.children[0], loop, lifted)].epsilon.push_back(loop);
        return loop;
      }
      int32_t exit = nfa.add();
      for (int32_t i = e.min_count; i < e.max_count; ++i) {
        nfa.states[at].epsilon.push_back(exit);
        at = build_fragment(grammar, nfa, e.children[0], at, lifted);
      }
      nfa.states[at].epsilon.push_back(exit);
      return exit;
    }
    case Kind::kAutomaton: {
      const Automaton& a = grammar.automaton_at(e.index);
      int32_t end = nfa.add();
      if (a.num_states == 0) return end;
      int32_t base = static_cast<int32_t>(nfa.states.size());
      for (int32_t s = 0; s < a.num_states; ++s) nfa.add();
      for (int32_t s = 0; s < a.num_states; ++s) {
        // Group the bytes by target so a state gets one edge per target, not one per byte.
        std::map<int32_t, ByteSet> by_target;
        for (int b = 0; b < 256; ++b) {
          int32_t t = a.step(s, static_cast<uint8_t>(b));
          if (t >= 0) by_target[t].add(static_cast<uint8_t>(b));
        }
        for (auto& [target, set] : by_target) nfa.states[base + s].byte_edges.emplace_back(set, base + target);
        for (auto [rule, target] : a.calls[s]) nfa.states[base + s].call_edges.emplace_back(rule, base + target);
        if (a.accepting[s]) nfa.states[base + s].epsilon.push_back(end);
      }
      nfa.states[from].epsilon.push_back(base);
      return end;
    }
  }
  return from;
}

std::vector<int32_t> epsilon_closure(const Nfa& nfa, std::vector<int32_t> seeds) {
  std::vector<uint8_t> seen(nfa.states.size(), 0);
  std::vector<int32_t> out;
  while (!seeds.empty()) {
    int32_t s = seeds.back();
    seeds.pop_back();
    if (seen[s]) continue;
    seen[s] = 1;
    out.push_back(s);
    for (int32_t t : nfa.states[s].epsilon) seeds.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Automaton determinize(const Nfa& nfa, int32_t start, int32_t accept) {
  Automaton dfa;
  std::map<std::vector<int32_t>, int32_t> index;
  std::vector<std::vector<int32_t>> sets;
  auto intern = [&](std::vector<int32_t> set) {
    auto [it, inserted] = index.emplace(set, dfa.num_states);
    if (inserted) {
      dfa.add_state();
      dfa.accepting.back() = std::binary_search(set.begin(), set.end(), accept);
      sets.push_back(std::move(set));
    }
    return it->second;
  };
  intern(epsilon_closure(nfa, {start}));
  for (int32_t d = 0; d < dfa.num_states; ++d) {
    std::array<std::vector<int32_t>, 256> by_byte;
    std::map<RuleId, std::vector<int32_t>> by_rule;
    for (int32_t s : sets[d]) {
      for (const auto& [set, target] : nfa.states[s].byte_edges)
        for (int b = 0; b < 256; ++b)
          if (set.contains(static_cast<uint8_t>(b))) by_byte[b].push_back(target);
      for (auto [rule, target] : nfa.states[s].call_edges) by_rule[rule].push_back(target);
    }
    std::map<std::vector<int32_t>, int32_t> closed;  // many bytes share one target set
    for (int b = 0; b < 256; ++b) {
      if (by_byte[b].empty()) continue;
      auto [it, inserted] = closed.emplace(by_byte[b], -1);
      if (inserted) it->second = intern(epsilon_closure(nfa, by_byte[b]));
      dfa.next[static_cast<size_t>(d) * 256 + b] = it->second;
    }
    for (auto& [rule, targets] : by_rule) {
      int32_t t = intern(epsilon_closure(nfa, targets));
      dfa.calls[d].emplace_back(rule, t);
    }
  }
  return dfa;
}

// Keeps the states reachable from the start that can reach an accepting state; state 0 stays the start.
Automaton trim(const Automaton& a) {
  if (a.num_states == 0) return a;
  std::vector<std::vector<int32_t>> reverse(a.num_states);
  for (int32_t s = 0; s < a.num_states; ++s) {
    for (int b = 0; b < 256; ++b)
      if (int32_t t = a.step(s, static_cast<uint8_t>(b)); t >= 0) reverse[t].push_back(s);
    for (auto [rule, t] : a.calls[s]) reverse[t].push_back(s);
  }
  std::vector<uint8_t> live(a.num_states, 0);
  std::vector<int32_t> work;
  for (int32_t s = 0; s < a.num_states; ++s)
    if (a.accepting[s]) { live[s] = 1; work.push_back(s); }
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (int32_t p : reverse[s])
      if (!live[p]) { live[p] = 1; work.push_back(p); }
  }
  if (!live[0]) return Automaton{};
  std::vector<int32_t> remap(a.num_states, -1);
  Automaton out;
  work = {0};
  remap[0] = out.add_state();
  std::vector<int32_t> order;
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    order.push_back(s);
    auto visit = [&](int32_t t) {
      if (t >= 0 && live[t] && remap[t] < 0) { remap[t] = out.add_state(); work.push_back(t); }
    };
    for (int b = 0; b < 256; ++b) visit(a.step(s, static_cast<uint8_t>(b)));
    for (auto [rule, t] : a.calls[s]) visit(t);
  }
  for (int32_t s : order) {
    int32_t n = remap[s];
    out.accepting[n] = a.accepting[s];
    for (int b = 0; b < 256; ++b) {
      int32_t t = a.step(s, static_cast<uint8_t>(b));
      if (t >= 0 && live[t]) out.next[static_cast<size_t>(n) * 256 + b] = remap[t];
    }
    for (auto [rule, t] : a.calls[s])
      if (live[t]) out.calls[n].emplace_back(rule, remap[t]);
  }
  return out;
}

}  // namespace

Automaton minimize(const Automaton& input) {
  Automaton a = trim(input);
  if (a.num_states == 0) return a;
  // Moore refinement: split classes by (class, accepting, class of each byte target, calls) until stable.
  std::vector<int32_t> cls(a.num_states);
  for (int32_t s = 0; s < a.num_states; ++s) cls[s] = a.accepting[s];
  int32_t num_classes = 0;
  // A signature lists the row as runs (first byte, target class) rather than 256 entries: rows are mostly a
  // few ranges, and hashing short signatures keeps each round linear in the states.
  struct SignatureHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  for (;;) {
    std::unordered_map<std::vector<int32_t>, int32_t, SignatureHash> signatures;
    signatures.reserve(static_cast<size_t>(a.num_states) * 2);
    std::vector<int32_t> next_cls(a.num_states);
    std::vector<int32_t> signature;
    for (int32_t s = 0; s < a.num_states; ++s) {
      signature.assign(1, cls[s]);
      int32_t previous = -2;
      for (int b = 0; b < 256; ++b) {
        int32_t t = a.step(s, static_cast<uint8_t>(b));
        const int32_t target = t < 0 ? -1 : cls[t];
        if (target == previous) continue;
        signature.push_back(b);
        signature.push_back(target);
        previous = target;
      }
      signature.push_back(-3);  // the calls follow
      for (auto [rule, t] : a.calls[s]) { signature.push_back(rule); signature.push_back(cls[t]); }
      auto [it, inserted] = signatures.emplace(signature, static_cast<int32_t>(signatures.size()));
      next_cls[s] = it->second;
    }
    int32_t count = static_cast<int32_t>(signatures.size());
    cls.swap(next_cls);
    if (count == num_classes) break;
    num_classes = count;
  }
  // Renumber so the start's class is state 0.
  std::vector<int32_t> remap(num_classes, -1);
  Automaton out;
  remap[cls[0]] = out.add_state();
  for (int32_t s = 0; s < a.num_states; ++s)
    if (remap[cls[s]] < 0) remap[cls[s]] = out.add_state();
  std::vector<uint8_t> done(num_classes, 0);
  for (int32_t s = 0; s < a.num_states; ++s) {
    int32_t n = remap[cls[s]];
    if (done[n]) continue;
    done[n] = 1;
    out.accepting[n] = a.accepting[s];
    for (int b = 0; b < 256; ++b) {
      int32_t t = a.step(s, static_cast<uint8_t>(b));
      if (t >= 0) out.next[static_cast<size_t>(n) * 256 + b] = remap[cls[t]];
    }
    for (auto [rule, t] : a.calls[s]) out.calls[n].emplace_back(rule, remap[cls[t]]);
  }
  return out;
}

Automaton intersect(const Automaton& a, const Automaton& b) {
  Automaton out;
  if (a.num_states == 0 || b.num_states == 0) return out;
  std::map<std::pair<int32_t, int32_t>, int32_t> index;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto intern = [&](int32_t x, int32_t y) {
    auto [it, inserted] = index.emplace(std::pair{x, y}, out.num_states);
    if (inserted) {
      out.add_state();
      out.accepting.back() = a.accepting[x] && b.accepting[y];
      pairs.emplace_back(x, y);
    }
    return it->second;
  };
  intern(0, 0);
  for (int32_t s = 0; s < out.num_states; ++s) {
    auto [x, y] = pairs[s];
    for (int c = 0; c < 256; ++c) {
      int32_t tx = a.step(x, static_cast<uint8_t>(c)), ty = b.step(y, static_cast<uint8_t>(c));
      if (tx >= 0 && ty >= 0) {
        int32_t t = intern(tx, ty);
        out.next[static_cast<size_t>(s) * 256 + c] = t;
      }
    }
  }
  return minimize(out);
}

Automaton complement(const Automaton& a) {
  Automaton out = a;
  if (out.num_states == 0) out.add_state();
  int32_t sink = out.add_state();
  for (int32_t s = 0; s < out.num_states; ++s) {
    out.accepting[s] = !out.accepting[s];
    for (int b = 0; b < 256; ++b)
      if (out.next[static_cast<size_t>(s) * 256 + b] < 0) out.next[static_cast<size_t>(s) * 256 + b] = sink;
  }
  return minimize(out);
}

namespace {

// The automaton of one expression, calls kept (no counted repetition lifted out of it).
Automaton expression_automaton(const Grammar& grammar, ExprId id) {
  Nfa nfa;
  int32_t start = nfa.add();
  int32_t end = build_fragment(grammar, nfa, id, start, nullptr);
  return minimize(determinize(nfa, start, end));
}

Automaton repetition_loop(const Grammar& grammar, ExprId child) {
  Nfa nfa;
  int32_t start = nfa.add();
  int32_t loop = nfa.add();
  nfa.states[start].epsilon.push_back(loop);
  nfa.states[build_fragment(grammar, nfa, child, loop, nullptr)].epsilon.push_back(loop);
  return minimize(determinize(nfa, start, loop));
}

// The start state of child*'s minimal automaton is where a repetition begins, and only there, when the child is a
// prefix code (no match is a proper prefix of another: its accepting states read and call nothing more) that matches
// no empty string: then a prefix of child* has child* as its residual exactly when it ends a repetition. The child may
// call rules (an array's `, item`), but not from its start: the byte that begins a repetition is read in the frame
// that holds the count.
bool countable_repetition(const Grammar& grammar, const Grammar::Expr& e) {
  const Automaton child = expression_automaton(grammar, e.children[0]);
  if (child.num_states == 0 || child.accepting[0] || !child.calls[0].empty()) return false;
  for (int32_t s = 0; s < child.num_states; ++s)
    if (child.accepting[s]) {
      if (!child.calls[s].empty()) return false;
      for (int b = 0; b < 256; ++b)
        if (child.step(s, static_cast<uint8_t>(b)) >= 0) return false;
    }
  return true;
}

// JSON string content's decoder: 0 at a character boundary, 1..7 inside a UTF-8 character (utf8_prefix_step), then
// after a backslash, and inside a backslash-u escape with 4..1 hex digits to come; kUtf8Invalid for bytes canonical content lacks.
constexpr uint8_t kAfterBackslash = 10, kHexDigitsLeft4 = 14;
uint8_t json_content_step(uint8_t state, uint8_t byte) {
  if (state == 0 && byte == '\\') return kAfterBackslash;
  if (state < kUtf8Invalid) return utf8_prefix_step(state, byte);
  if (state == kAfterBackslash) return byte == 'u' ? kHexDigitsLeft4 : 0;
  if (!std::isxdigit(byte)) return kUtf8Invalid;
  return state == kHexDigitsLeft4 - 3 ? 0 : static_cast<uint8_t>(state - 1);
}

// The distinct targets of each state's byte edges and calls (a call, of a productive rule, as an edge to the state it
// returns to; counting states make no calls, so an edge adds counting[s] whatever it is).
std::vector<std::vector<int32_t>> successors(const Automaton& a) {
  std::vector<std::vector<int32_t>> out(a.num_states);
  for (int32_t s = 0; s < a.num_states; ++s) {
    for (int b = 0; b < 256; ++b)
      if (int32_t t = a.step(s, static_cast<uint8_t>(b)); t >= 0) out[s].push_back(t);
    for (auto [rule, t] : a.calls[s]) out[s].push_back(t);
    std::sort(out[s].begin(), out[s].end());
    out[s].erase(std::unique(out[s].begin(), out[s].end()), out[s].end());
  }
  return out;
}

// Per state, the fewest counted bytes on a path to an accepting state (a 0-1 breadth-first search backwards);
// INT32_MAX where none is reachable.
std::vector<int32_t> shortest_counts(const Automaton& a, const std::vector<uint8_t>& counting) {
  std::vector<std::vector<int32_t>> reverse(a.num_states);
  const std::vector<std::vector<int32_t>> next = successors(a);
  for (int32_t s = 0; s < a.num_states; ++s)
    for (int32_t t : next[s]) reverse[t].push_back(s);
  std::vector<int32_t> shortest(a.num_states, INT32_MAX);
  std::deque<int32_t> work;
  for (int32_t s = 0; s < a.num_states; ++s)
    if (a.accepting[s]) { shortest[s] = 0; work.push_back(s); }
  while (!work.empty()) {
    const int32_t t = work.front();
    work.pop_front();
    for (int32_t s : reverse[t]) {
      const int32_t via = shortest[t] + counting[s];
      if (via >= shortest[s]) continue;
      shortest[s] = via;
      if (counting[s]) work.push_back(s);
      else work.push_front(s);
    }
  }
  return shortest;
}

}  // namespace

std::optional<std::vector<uint8_t>> json_character_starts(const Automaton& content) {
  std::vector<uint8_t> decoder(content.num_states, kUtf8Invalid + 1);  // unset
  std::vector<int32_t> work;
  if (content.num_states > 0) { decoder[0] = 0; work.push_back(0); }
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    for (int b = 0; b < 256; ++b) {
      const int32_t t = content.step(s, static_cast<uint8_t>(b));
      if (t < 0) continue;
      const uint8_t next = json_content_step(decoder[s], static_cast<uint8_t>(b));
      if (next == kUtf8Invalid) return std::nullopt;
      if (decoder[t] == kUtf8Invalid + 1) { decoder[t] = next; work.push_back(t); }
      else if (decoder[t] != next) return std::nullopt;
    }
  }
  std::vector<uint8_t> starts(content.num_states);
  for (int32_t s = 0; s < content.num_states; ++s) starts[s] = decoder[s] == 0;
  return starts;
}

bool counter_is_exact(const Automaton& a, const std::vector<uint8_t>& counting, int32_t min_count, int32_t max_count,
                      const std::string& keyword) {
  if (a.num_states == 0) return false;
  for (int32_t s = 0; s < a.num_states; ++s)
    if (counting[s] && !a.calls[s].empty()) return false;
  // Counts past the largest one that matters are all alike: max_count, or min_count when unbounded.
  const int64_t cap = max_count >= 0 ? max_count : min_count;
  const int64_t width = cap + 1;
  if (a.num_states * width > (int64_t{1} << 24)) refuse(keyword, "the bound is too large to enforce");
  const std::vector<int32_t> shortest = shortest_counts(a, counting);
  const std::vector<std::vector<int32_t>> next = successors(a);
  // The matcher's rule: from (s, c) to (t, c + counting[s]), capped when unbounded, while an end stays in reach.
  auto step = [&](int32_t s, int64_t c, int32_t t) -> int64_t {
    const int64_t to = counting[s] ? std::min(c + 1, max_count >= 0 ? c + 1 : cap) : c;
    if (max_count >= 0 && (to > max_count || shortest[t] == INT32_MAX || to + shortest[t] > max_count)) return -1;
    return to;
  };
  auto ends = [&](int32_t s, int64_t c) { return a.accepting[s] && c >= min_count; };
  // Which pairs reach an end: counts never drop, so by layers from the highest count down; in a layer, backwards
  // over the edges that keep the count (and, in the capped layer, the counted ones too).
  std::vector<uint8_t> reaches(static_cast<size_t>(a.num_states * width), 0);
  std::vector<std::vector<int32_t>> reverse(a.num_states);
  for (int32_t s = 0; s < a.num_states; ++s)
    for (int32_t t : next[s]) reverse[t].push_back(s);
  for (int64_t c = cap; c >= 0; --c) {
    auto at = [&](int32_t s) -> uint8_t& { return reaches[static_cast<size_t>(s * width + c)]; };
    std::vector<int32_t> work;
    for (int32_t s = 0; s < a.num_states; ++s) {
      bool yes = ends(s, c);
      for (size_t i = 0; !yes && i < next[s].size(); ++i) {
        const int32_t t = next[s][i];
        const int64_t to = step(s, c, t);
        yes = to > c && reaches[static_cast<size_t>(t * width + to)];
      }
      if (yes) { at(s) = 1; work.push_back(s); }
    }
    while (!work.empty()) {
      const int32_t t = work.back();
      work.pop_back();
      for (int32_t s : reverse[t])
        if (!at(s) && step(s, c, t) == c) { at(s) = 1; work.push_back(s); }
    }
  }
  // Every pair the matcher can reach from the start must reach an end.
  std::vector<uint8_t> seen(reaches.size(), 0);
  std::vector<std::pair<int32_t, int64_t>> work = {{0, 0}};
  seen[0] = 1;
  while (!work.empty()) {
    const auto [s, c] = work.back();
    work.pop_back();
    if (!reaches[static_cast<size_t>(s * width + c)]) return false;
    for (int32_t t : next[s]) {
      const int64_t to = step(s, c, t);
      if (to < 0 || seen[static_cast<size_t>(t * width + to)]) continue;
      seen[static_cast<size_t>(t * width + to)] = 1;
      work.emplace_back(t, to);
    }
  }
  return true;
}

ExprId Grammar::add(Expr expr) {
  exprs_.push_back(std::move(expr));
  return static_cast<ExprId>(exprs_.size()) - 1;
}

ExprId Grammar::empty() { return add(Expr{.kind = Expr::Kind::kEmpty}); }
ExprId Grammar::nothing() { return add(Expr{.kind = Expr::Kind::kNothing}); }
ExprId Grammar::bytes(const ByteSet& set) {
  if (set.empty()) return nothing();
  return add(Expr{.kind = Expr::Kind::kBytes, .bytes = set});
}
ExprId Grammar::literal(std::string_view text) {
  std::vector<ExprId> parts;
  for (char c : text) parts.push_back(bytes(ByteSet::single(static_cast<uint8_t>(c))));
  return sequence(std::move(parts));
}
ExprId Grammar::rule_ref(RuleId rule) { return add(Expr{.kind = Expr::Kind::kRule, .index = rule}); }
ExprId Grammar::sequence(std::vector<ExprId> children) {
  std::erase_if(children, [&](ExprId c) { return exprs_[c].kind == Expr::Kind::kEmpty; });
  for (ExprId c : children)
    if (exprs_[c].kind == Expr::Kind::kNothing) return nothing();
  if (children.empty()) return empty();
  if (children.size() == 1) return children[0];
  return add(Expr{.kind = Expr::Kind::kSequence, .children = std::move(children)});
}
ExprId Grammar::choice(std::vector<ExprId> children) {
  std::erase_if(children, [&](ExprId c) { return exprs_[c].kind == Expr::Kind::kNothing; });
  if (children.empty()) return nothing();
  if (children.size() == 1) return children[0];
  return add(Expr{.kind = Expr::Kind::kChoice, .children = std::move(children)});
}
ExprId Grammar::repeat(ExprId child, int32_t min_count, int32_t max_count) {
  if (max_count == 0) return empty();
  if (min_count == 1 && max_count == 1) return child;
  if (exprs_[child].kind == Expr::Kind::kNothing) return min_count == 0 ? empty() : nothing();
  return add(Expr{.kind = Expr::Kind::kRepeat, .min_count = min_count, .max_count = max_count, .children = {child}});
}
ExprId Grammar::automaton(Automaton a) {
  if (a.num_states == 0) return nothing();
  automata_.push_back(std::move(a));
  return add(Expr{.kind = Expr::Kind::kAutomaton, .index = static_cast<int32_t>(automata_.size()) - 1});
}

ExprId Grammar::counted(ExprId body, CountUnit unit, int32_t min_count, int32_t max_count) {
  require(min_count >= 0 && (max_count < 0 || max_count >= min_count), "grammar: counted repetition bounds {}..{}",
          min_count, max_count);
  return add(Expr{.kind = Expr::Kind::kCounted, .min_count = min_count, .max_count = max_count, .unit = unit,
                  .children = {body}});
}

RuleId Grammar::add_rule(std::string name) {
  require(!rule_by_name_.contains(name), "grammar: rule '{}' defined twice", name);
  rule_by_name_.emplace(name, num_rules());
  rules_.push_back(Rule{std::move(name), -1});
  return num_rules() - 1;
}

RuleId Grammar::import(const Grammar& other, const std::string& prefix) {
  require(other.root() >= 0, "grammar: the grammar to import has no root rule");
  const auto expr_base = static_cast<ExprId>(exprs_.size());
  const RuleId rule_base = num_rules();
  const auto automaton_base = static_cast<int32_t>(automata_.size());
  automata_.insert(automata_.end(), other.automata_.begin(), other.automata_.end());
  for (Expr e : other.exprs_) {  // verbatim, ids shifted: the builders' simplifications were applied already
    if (e.kind == Expr::Kind::kRule) e.index += rule_base;
    if (e.kind == Expr::Kind::kAutomaton) e.index += automaton_base;
    for (ExprId& child : e.children) child += expr_base;
    exprs_.push_back(std::move(e));
  }
  for (const Rule& rule : other.rules_) set_body(add_rule(prefix + rule.name), rule.body < 0 ? -1 : rule.body + expr_base);
  return other.root() + rule_base;
}

RuleId Grammar::find_rule(std::string_view name) const {
  auto it = rule_by_name_.find(std::string(name));
  return it == rule_by_name_.end() ? -1 : it->second;
}

Automaton Grammar::to_automaton(ExprId id) const {
  Nfa nfa;
  int32_t start = nfa.add();
  int32_t end = build_fragment(*this, nfa, id, start, nullptr);
  Automaton dfa = determinize(nfa, start, end);
  require(!dfa.has_calls(), "grammar: a rule reference where only a regular expression is allowed");
  return minimize(dfa);
}

std::vector<RuleAutomaton> Grammar::compile_rules() const {
  Lifted lifted{num_rules(), {}};
  std::vector<Automaton> raw(rules_.size());
  for (RuleId r = 0; r < num_rules(); ++r) {
    require(rules_[r].body >= 0, "grammar: rule '{}' is used but never defined", rules_[r].name);
    Nfa nfa;
    int32_t start = nfa.add();
    int32_t end = build_fragment(*this, nfa, rules_[r].body, start, &lifted);
    raw[r] = determinize(nfa, start, end);
  }
  std::vector<RuleAutomaton> out(rules_.size());
  for (ExprId id : lifted.exprs) {  // call-free bodies: nothing more is lifted meanwhile
    const Expr& e = exprs_[id];
    RuleAutomaton rule;
    rule.counted = true;
    rule.min_count = e.min_count;
    rule.max_count = e.max_count;
    if (e.unit == CountUnit::kRepetition) {
      require(countable_repetition(*this, e), "grammar: a counted repetition whose body is not a prefix code");
      rule.automaton = repetition_loop(*this, e.children[0]);
    } else {
      rule.automaton = expression_automaton(*this, e.children[0]);
      auto starts = json_character_starts(rule.automaton);
      require(starts.has_value(), "grammar: a length-bounded string whose characters cannot be counted");
      rule.counting = std::move(*starts);
    }
    raw.push_back(Automaton{});  // not minimized again below: the counting states are per state
    out.push_back(std::move(rule));
  }
  const auto num_all = static_cast<RuleId>(out.size());
  auto name = [&](RuleId r) { return r < num_rules() ? rules_[r].name : "counted repetition " + std::to_string(r); };
  // A rule is productive when some path from its start reaches an accepting state through bytes and calls of
  // productive rules; calls of unproductive rules are dropped so no dead prefix is ever allowed. A counted repetition
  // is when it may repeat 0 times or its body can complete (a counted string's content is call-free: counter_is_exact
  // below finds a string within its bounds).
  std::vector<uint8_t> productive(num_all, 0);
  auto without_unproductive_calls = [&](Automaton a) {
    for (auto& list : a.calls)
      std::erase_if(list, [&](const auto& call) { return !productive[call.first]; });
    return a;
  };
  for (RuleId r = num_rules(); r < num_all; ++r)
    productive[r] = !out[r].automaton.has_calls() || out[r].min_count == 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (RuleId r = 0; r < num_all; ++r) {
      if (productive[r]) continue;
      // A repetition loop's only accepting state is its start: the body completes when the start reaches itself.
      const Automaton pruned = trim(without_unproductive_calls(r < num_rules() ? raw[r] : out[r].automaton));
      const bool completes = pruned.num_states > 0 && (r < num_rules() || !successors(pruned)[0].empty());
      if (completes) { productive[r] = 1; changed = true; }
    }
  }
  for (RuleId r = 0; r < num_rules(); ++r) out[r].automaton = minimize(without_unproductive_calls(raw[r]));
  for (RuleId r = num_rules(); r < num_all; ++r) {
    RuleAutomaton& rule = out[r];
    if (rule.counting.empty()) {  // a repetition loop: state 0 (the start) begins a repetition
      rule.automaton = minimize(without_unproductive_calls(rule.automaton));
      rule.counting.assign(rule.automaton.num_states, 0);
      if (rule.automaton.num_states > 0) rule.counting[0] = 1;
    }
    if (!productive[r]) {  // no call of it is left
      rule = RuleAutomaton{};
      continue;
    }
    require(counter_is_exact(rule.automaton, rule.counting, rule.min_count, rule.max_count, "grammar"),
            "grammar: a counted repetition whose bounds the counter cannot enforce exactly");
    rule.shortest = shortest_counts(rule.automaton, rule.counting);
  }
  // Left recursion (a rule reaching a call of itself without reading a byte) would grow the stack forever.
  std::vector<uint8_t> nullable(num_all, 0);
  auto epsilon_states = [&](RuleId r) {
    std::vector<int32_t> states;
    const Automaton& a = out[r].automaton;
    if (a.num_states == 0) return states;
    std::vector<uint8_t> seen(a.num_states, 0);
    std::vector<int32_t> work = {0};
    seen[0] = 1;
    while (!work.empty()) {
      int32_t s = work.back();
      work.pop_back();
      states.push_back(s);
      for (auto [callee, t] : a.calls[s])
        if (nullable[callee] && !seen[t]) { seen[t] = 1; work.push_back(t); }
    }
    return states;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (RuleId r = 0; r < num_all; ++r) {
      if (nullable[r] || (out[r].counted && out[r].min_count > 0)) continue;
      for (int32_t s : epsilon_states(r))
        if (out[r].automaton.accepting[s]) { nullable[r] = 1; changed = true; break; }
    }
  }
  std::vector<int> color(num_all, 0);
  std::function<void(RuleId)> visit = [&](RuleId r) {
    color[r] = 1;
    for (int32_t s : epsilon_states(r))
      for (auto [callee, t] : out[r].automaton.calls[s]) {
        if (color[callee] == 1) refuse("grammar", "rule '" + name(callee) + "' is left-recursive");
        if (color[callee] == 0) visit(callee);
      }
    color[r] = 2;
  };
  for (RuleId r = 0; r < num_all; ++r)
    if (color[r] == 0) visit(r);
  return out;
}

namespace {

// [low, high] within one encoded length: split until every byte position is an independent range.
ExprId utf8_same_length(Grammar& g, uint32_t low, uint32_t high) {
  std::string lo_bytes, hi_bytes;
  text::append_utf8(lo_bytes, low);
  text::append_utf8(hi_bytes, high);
  size_t n = lo_bytes.size();
  for (size_t i = 1; i < n; ++i) {
    uint32_t mask = (1u << (6 * i)) - 1;
    if ((low & ~mask) != (high & ~mask)) {
      if ((low & mask) != 0)
        return g.choice({utf8_same_length(g, low, low | mask), utf8_same_length(g, (low | mask) + 1, high)});
      if ((high & mask) != mask)
        return g.choice({utf8_same_length(g, low, (high & ~mask) - 1), utf8_same_length(g, high & ~mask, high)});
    }
  }
  std::vector<ExprId> parts;
  for (size_t i = 0; i < n; ++i)
    parts.push_back(g.bytes(ByteSet::range(static_cast<uint8_t>(lo_bytes[i]), static_cast<uint8_t>(hi_bytes[i]))));
  return g.sequence(std::move(parts));
}

}  // namespace

ExprId utf8_range(Grammar& g, uint32_t low, uint32_t high) {
  std::vector<ExprId> parts;
  const uint32_t bounds[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (auto [lo, hi] : bounds) {
    uint32_t a = std::max(lo, low), b = std::min(hi, high);
    if (a <= b) parts.push_back(utf8_same_length(g, a, b));
  }
  return g.choice(std::move(parts));
}

}  // namespace beamline
