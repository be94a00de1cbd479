#pragma once
// A context-free grammar over bytes whose rule bodies are regular expressions over bytes and rule references
// (EBNF style: repetition stays inside a rule, so a long string or array never deepens the parse stack).
// Every front end (JSON Schema, regular expressions, EBNF, choice lists) builds one of these; compile() turns
// each rule body into a minimal deterministic automaton whose edges are bytes or calls of other rules.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/error.h"

namespace beamline {

// A request field or schema keyword the grammar engine cannot enforce; `keyword` names it for the 400.
class UnsupportedGrammar : public Error {
 public:
  UnsupportedGrammar(std::string keyword, const std::string& message)
      : Error(message), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

[[noreturn]] inline void refuse(const std::string& keyword, const std::string& why) {
  throw UnsupportedGrammar(keyword, "'" + keyword + "' cannot be enforced: " + why);
}

struct ByteSet {
  std::array<uint64_t, 4> words{};

  static ByteSet single(uint8_t byte) { ByteSet set; set.add(byte); return set; }
  static ByteSet range(uint8_t low, uint8_t high) { ByteSet set; set.add_range(low, high); return set; }
  void add(uint8_t byte) { words[byte >> 6] |= uint64_t{1} << (byte & 63); }
  void add_range(uint8_t low, uint8_t high) { for (int b = low; b <= high; ++b) add(static_cast<uint8_t>(b)); }
  bool contains(uint8_t byte) const { return (words[byte >> 6] >> (byte & 63)) & 1; }
  bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
  int count() const;
  ByteSet& operator|=(const ByteSet& other) { for (int i = 0; i < 4; ++i) words[i] |= other.words[i]; return *this; }
  ByteSet complement() const { ByteSet set; for (int i = 0; i < 4; ++i) set.words[i] = ~words[i]; return set; }
  bool operator==(const ByteSet&) const = default;
};

using ExprId = int32_t;
using RuleId = int32_t;

// What a counted repetition counts (Grammar::counted).
enum class CountUnit : uint8_t {
  kRepetition,     // repetitions of the body
  kJsonCharacter,  // characters of canonical JSON string content: a UTF-8 character or one escape sequence
};

// An incremental UTF-8 well-formedness check (the decoder of tokenizer/utf8.h as a state machine): 0 at a
// character boundary, 1..7 inside a character (which continuation bytes may come), kUtf8Invalid once the bytes
// cannot be well-formed UTF-8 any more.
inline constexpr uint8_t kUtf8Invalid = 8;
namespace detail {
constexpr uint8_t utf8_prefix_transition(uint8_t state, uint8_t byte) {
  auto continuation = [byte](uint8_t low, uint8_t high, uint8_t next) {
    return byte >= low && byte <= high ? next : kUtf8Invalid;
  };
  switch (state) {
    case 0:
      if (byte < 0x80) return 0;
      if (byte >= 0xC2 && byte <= 0xDF) return 1;
      if (byte == 0xE0) return 4;
      if (byte == 0xED) return 5;
      if (byte >= 0xE1 && byte <= 0xEF) return 2;
      if (byte == 0xF0) return 6;
      if (byte >= 0xF1 && byte <= 0xF3) return 3;
      if (byte == 0xF4) return 7;
      return kUtf8Invalid;
    case 1: return continuation(0x80, 0xBF, 0);
    case 2: return continuation(0x80, 0xBF, 1);
    case 3: return continuation(0x80, 0xBF, 2);
    case 4: return continuation(0xA0, 0xBF, 1);  // after E0: no overlong forms
    case 5: return continuation(0x80, 0x9F, 1);  // after ED: no surrogates
    case 6: return continuation(0x90, 0xBF, 2);  // after F0: no overlong forms
    case 7: return continuation(0x80, 0x8F, 2);  // after F4: nothing above U+10FFFF
    default: return kUtf8Invalid;
  }
}
struct Utf8PrefixTable {
  std::array<std::array<uint8_t, 256>, kUtf8Invalid + 1> next{};
  constexpr Utf8PrefixTable() {
    for (int s = 0; s <= kUtf8Invalid; ++s)
      for (int b = 0; b < 256; ++b) next[s][b] = utf8_prefix_transition(static_cast<uint8_t>(s), static_cast<uint8_t>(b));
  }
};
inline constexpr Utf8PrefixTable kUtf8PrefixTable;
}  // namespace detail
// One table lookup: token classification steps it for every byte it explores.
inline uint8_t utf8_prefix_step(uint8_t state, uint8_t byte) { return detail::kUtf8PrefixTable.next[state][byte]; }

// A deterministic automaton over bytes with optional rule calls: state 0 is the start; next[s * 256 + b] is
// the state after byte b (-1: none); calls[s] are (rule, state to continue in once that rule has matched).
struct Automaton {
  int32_t num_states = 0;
  std::vector<int32_t> next;
  std::vector<uint8_t> accepting;
  std::vector<std::vector<std::pair<RuleId, int32_t>>> calls;

  int32_t add_state();
  int32_t step(int32_t state, uint8_t byte) const { return next[static_cast<size_t>(state) * 256 + byte]; }
  bool has_calls() const;
  bool matches(std::string_view bytes) const;  // call-free automata only
};

// Regular algebra on call-free automata (the results are trimmed and minimal; an empty language has 0 states).
Automaton intersect(const Automaton& a, const Automaton& b);
Automaton complement(const Automaton& a);  // every byte string that `a` does not match
Automaton minimize(const Automaton& a);    // also drops states that cannot reach an accepting state

// A rule as the pushdown matcher runs it. A counted rule keeps its count in the matcher's stack frame instead of one
// state per count: every byte read from a counting state adds one, and with frame count c in state q the matcher
// allows only c + shortest[q] <= max_count (some end is still within the bound) and ends the rule only once
// c >= min_count. A counted rule calls other rules only from states that do not count (a repetition's body after its
// first byte, e.g. an array's `, item`); a callee's bytes are its own frame's, never counted in this one.
struct RuleAutomaton {
  Automaton automaton;
  bool counted = false;
  int32_t min_count = 0, max_count = -1;  // -1: unbounded
  std::vector<uint8_t> counting;          // per state: a byte read from it is counted
  std::vector<int32_t> shortest;          // per state: the fewest counts to an accepting state
};

// The states where a character of canonical JSON string content starts (a byte read there begins one), found by
// decoding from the start; nullopt when some state is reached both at a character boundary and inside a character
// (then a counter over this automaton could not tell the length).
std::optional<std::vector<uint8_t>> json_character_starts(const Automaton& content);
// Does the counter of RuleAutomaton, over this call-free automaton and counting states, accept exactly the strings of
// `a` whose count is within min..max, and never allow a prefix that cannot reach such an end? Checked by exploring
// (state, count) pairs; false when no string qualifies too. Throws UnsupportedGrammar(keyword) when the bound is
// too large to check.
bool counter_is_exact(const Automaton& a, const std::vector<uint8_t>& counting, int32_t min_count, int32_t max_count,
                      const std::string& keyword);

class Grammar {
 public:
  struct Expr {
    enum class Kind : uint8_t { kEmpty, kNothing, kBytes, kRule, kSequence, kChoice, kRepeat, kAutomaton, kCounted };
    Kind kind = Kind::kEmpty;
    ByteSet bytes;
    int32_t index = -1;  // the rule of kRule, the automaton of kAutomaton
    int32_t min_count = 0, max_count = -1;  // kRepeat, kCounted; -1: unbounded
    CountUnit unit = CountUnit::kRepetition;  // kCounted
    std::vector<ExprId> children;
  };

  // Expression builders; a sequence or choice of one child is that child.
  ExprId empty();    // matches the empty string
  ExprId nothing();  // matches no string
  ExprId bytes(const ByteSet& set);
  ExprId literal(std::string_view text);
  ExprId rule_ref(RuleId rule);
  ExprId sequence(std::vector<ExprId> children);
  ExprId choice(std::vector<ExprId> children);
  ExprId repeat(ExprId child, int32_t min_count, int32_t max_count);
  ExprId optional(ExprId child) { return repeat(child, 0, 1); }
  ExprId star(ExprId child) { return repeat(child, 0, -1); }
  ExprId automaton(Automaton automaton);
  // `body` with min_count..max_count of `unit` (max -1: unbounded), counted by the matcher instead of unrolled into
  // one state per count. kRepetition: the body repeated; kJsonCharacter: `body` matches canonical JSON string
  // content and its length in characters is bounded (JSON Schema's minLength / maxLength). The counter must enforce
  // the bounds exactly (counter_is_exact); json_character_starts() must find the body's character boundaries.
  // Not regular as written: only a rule body may hold one (to_automaton refuses kJsonCharacter).
  ExprId counted(ExprId body, CountUnit unit, int32_t min_count, int32_t max_count);

  RuleId add_rule(std::string name);  // body set later (rules may refer to each other before they exist)
  void set_body(RuleId rule, ExprId body) { rules_.at(rule).body = body; }
  RuleId find_rule(std::string_view name) const;  // -1 when absent
  void set_root(RuleId rule) { root_ = rule; }
  // Copies every rule of `other` into this grammar (names prefixed with `prefix`, which must keep them unique) and
  // returns the rule that was its root: how one grammar embeds another (a tool's arguments inside Harmony's).
  RuleId import(const Grammar& other, const std::string& prefix);

  RuleId root() const { return root_; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  const std::string& rule_name(RuleId rule) const { return rules_.at(rule).name; }
  ExprId body(RuleId rule) const { return rules_.at(rule).body; }
  const Expr& expr(ExprId id) const { return exprs_.at(id); }
  const Automaton& automaton_at(int32_t index) const { return automata_.at(index); }

  // The call-free automaton of an expression without rule references (throws otherwise).
  Automaton to_automaton(ExprId id) const;
  // One automaton per rule, then one per counted repetition lifted out of a rule body (kCounted, and kRepeat over
  // more than kUnrolledRepeats); rules whose language is empty keep 0 states, and calls of them are dropped.
  std::vector<RuleAutomaton> compile_rules() const;
  // A repetition bounded by more than this many counts is counted by the matcher (when its body allows, see
  // RuleAutomaton) rather than unrolled, so its cost does not grow with the bound.
  static constexpr int32_t kUnrolledRepeats = 16;
  std::string describe(ExprId id) const;  // for tests and error messages

 private:
  struct Rule {
    std::string name;
    ExprId body = -1;
  };
  ExprId add(Expr expr);

  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  std::vector<Automaton> automata_;
  std::unordered_map<std::string, RuleId> rule_by_name_;
  RuleId root_ = -1;
};

// UTF-8 encodings of the code points in [low, high] (surrogates excluded) as a grammar expression.
ExprId utf8_range(Grammar& grammar, uint32_t low, uint32_t high);

}  // namespace beamline
