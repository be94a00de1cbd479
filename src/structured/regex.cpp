#include "structured/regex.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace beamline {

CodePointSet normalize(CodePointSet set) {
  std::sort(set.begin(), set.end());
  CodePointSet out;
  for (auto [lo, hi] : set) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

CodePointSet negate(const CodePointSet& input) {
  CodePointSet set = normalize(input);
  CodePointSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : set) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

namespace {

bool contains(const CodePointSet& set, uint32_t cp) {
  return std::any_of(set.begin(), set.end(), [&](auto r) { return r.first <= cp && cp <= r.second; });
}

CodePointSet subtract(const CodePointSet& set, const CodePointSet& removed) {
  CodePointSet both = negate(removed);
  CodePointSet out;
  for (auto [a, b] : normalize(set))
    for (auto [c, d] : both) {
      uint32_t lo = std::max(a, c), hi = std::min(b, d);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  return out;
}

}  // namespace

ExprId code_points(Grammar& g, const CodePointSet& input, RegexEncoding encoding) {
  CodePointSet set = normalize(input);
  std::vector<ExprId> parts;
  CodePointSet raw = set;
  if (encoding == RegexEncoding::kJsonString) {
    // Canonical JSON strings escape exactly `"`, `\` and the control characters, as JSON.stringify does.
    raw = subtract(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    const char* short_escape[32] = {};
    short_escape[0x08] = "\\b";
    short_escape[0x09] = "\\t";
    short_escape[0x0A] = "\\n";
    short_escape[0x0C] = "\\f";
    short_escape[0x0D] = "\\r";
    for (uint32_t cp = 0; cp < 0x20; ++cp) {
      if (!contains(set, cp)) continue;
      if (short_escape[cp]) {
        parts.push_back(g.literal(short_escape[cp]));
      } else {
        char buffer[8];
        snprintf(buffer, sizeof buffer, "\\u%04x", cp);
        parts.push_back(g.literal(buffer));
      }
    }
    if (contains(set, '"')) parts.push_back(g.literal("\\\""));
    if (contains(set, '\\')) parts.push_back(g.literal("\\\\"));
  }
  for (auto [lo, hi] : raw) parts.push_back(utf8_range(g, lo, hi));
  return g.choice(std::move(parts));
}

namespace {

CodePointSet digit_class() { return {{'0', '9'}}; }
CodePointSet word_class() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
CodePointSet space_class() {
  return {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
          {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view pattern, RegexEncoding encoding, const std::string& keyword)
      : g_(g), pattern_(pattern), encoding_(encoding), keyword_(keyword) {}

  ExprId parse_top(bool search) {
    // Each top-level alternative may be anchored at either end; unanchored ends match anything there.
    std::vector<ExprId> alternatives;
    do {
      bool anchored_start = eat('^');
      ExprId body = parse_sequence(true);
      bool anchored_end = eat('$');
      if (!at_end() && peek() != '|') fail_at("an anchor ('^' or '$') inside the pattern");
      std::vector<ExprId> parts;
      if (search && !anchored_start) parts.push_back(g_.star(any_char()));
      parts.push_back(body);
      if (search && !anchored_end) parts.push_back(g_.star(any_char()));
      alternatives.push_back(g_.sequence(std::move(parts)));
    } while (eat('|'));
    if (!at_end()) fail_at("an unbalanced ')'");
    return g_.choice(std::move(alternatives));
  }

 private:
  ExprId any_char() { return code_points(g_, {{0, 0x10FFFF}}, encoding_); }

  ExprId parse_alternation() {
    std::vector<ExprId> alternatives = {parse_sequence(false)};
    while (eat('|')) alternatives.push_back(parse_sequence(false));
    return g_.choice(std::move(alternatives));
  }

  ExprId parse_sequence(bool top) {
    std::vector<ExprId> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (top && peek() == '$' && (pos_ + 1 == pattern_.size() || pattern_[pos_ + 1] == '|')) break;
      items.push_back(parse_quantified());
    }
    return g_.sequence(std::move(items));
  }

  ExprId parse_quantified() {
    ExprId atom = parse_atom();
    for (;;) {
      int32_t lo, hi;
      if (eat('*')) { lo = 0; hi = -1; }
      else if (eat('+')) { lo = 1; hi = -1; }
      else if (eat('?')) { lo = 0; hi = 1; }
      else if (peek_is_counted_repeat()) { parse_counts(lo, hi); }
      else return atom;
      eat('?');  // lazy: the same strings
      if (!at_end() && peek() == '+') fail_at("a possessive quantifier");
      atom = g_.repeat(atom, lo, hi);
    }
  }

  bool peek_is_counted_repeat() const {
    if (at_end() || peek() != '{') return false;
    size_t i = pos_ + 1;
    size_t digits = 0;
    while (i < pattern_.size() && isdigit(static_cast<unsigned char>(pattern_[i]))) { ++i; ++digits; }
    return digits > 0 && i < pattern_.size() && (pattern_[i] == '}' || pattern_[i] == ',');
  }

  void parse_counts(int32_t& lo, int32_t& hi) {
    eat('{');
    lo = parse_number();
    hi = lo;
    if (eat(',')) hi = (!at_end() && peek() == '}') ? -1 : parse_number();
    if (!eat('}')) fail_at("a malformed {n,m} quantifier");
    if (hi >= 0 && hi < lo) fail_at("a {n,m} quantifier with m < n");
    if (std::max(lo, hi) > 10000) fail_at("a repetition count over 10000");
  }

  int32_t parse_number() {
    int64_t value = 0;
    size_t start = pos_;
    while (!at_end() && isdigit(static_cast<unsigned char>(peek()))) {
      value = std::min<int64_t>(value * 10 + (pattern_[pos_++] - '0'), 1000000);
    }
    if (pos_ == start) fail_at("a malformed {n,m} quantifier");
    return static_cast<int32_t>(value);
  }

  ExprId parse_atom() {
    char c = pattern_[pos_++];
    switch (c) {
      case '(': {
        if (eat('?')) {
          if (eat(':')) {
          } else if (eat('<') && !at_end() && peek() != '=' && peek() != '!') {
            while (!at_end() && peek() != '>') ++pos_;
            if (!eat('>')) fail_at("a malformed group name");
          } else {
            fail_at("lookaround or inline flags ('(?')");
          }
        }
        ExprId inner = parse_alternation();
        if (!eat(')')) fail_at("an unclosed '('");
        return inner;
      }
      case '.': return code_points(g_, negate({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}), encoding_);
      case '[': return code_points(g_, parse_class(), encoding_);
      case '\\': return parse_escape_atom();
      case '^': case '$': fail_at("an anchor ('^' or '$') inside the pattern");
      case '*': case '+': case '?': fail_at("a quantifier with nothing to repeat");
      default: {
        --pos_;
        uint32_t cp = next_code_point();
        return code_points(g_, {{cp, cp}}, encoding_);
      }
    }
  }

  ExprId parse_escape_atom() {
    if (at_end()) fail_at("a trailing '\\'");
    char c = peek();
    if (c == 'b' || c == 'B') fail_at("a word boundary ('\\b')");
    if (c >= '1' && c <= '9') fail_at("a backreference");
    if (c == 'k') fail_at("a named backreference");
    CodePointSet set = parse_escape();
    return code_points(g_, set, encoding_);
  }

  // After the backslash; returns the set the escape stands for.
  CodePointSet parse_escape() {
    if (at_end()) fail_at("a trailing '\\'");
    char c = pattern_[pos_++];
    switch (c) {
      case 'd': return digit_class();
      case 'D': return negate(digit_class());
      case 'w': return word_class();
      case 'W': return negate(word_class());
      case 's': return space_class();
      case 'S': return negate(space_class());
      case 't': return {{'\t', '\t'}};
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': { uint32_t v = parse_hex(2); return {{v, v}}; }
      case 'u': {
        uint32_t v;
        if (eat('{')) {
          v = 0;
          size_t start = pos_;
          while (!at_end() && isxdigit(static_cast<unsigned char>(peek()))) v = v * 16 + hex_value(pattern_[pos_++]);
          if (pos_ == start || !eat('}') || v > 0x10FFFF) fail_at("a malformed \\u{...} escape");
        } else {
          v = parse_hex(4);
        }
        if (v >= 0xD800 && v <= 0xDFFF) fail_at("a surrogate code point escape");
        return {{v, v}};
      }
      case 'p': case 'P': fail_at("a Unicode property escape ('\\p')");
      case 'c': fail_at("a control escape ('\\c')");
      default:
        if (isalnum(static_cast<unsigned char>(c))) fail_at(std::string("the escape '\\") + c + "'");
        --pos_;
        { uint32_t cp = next_code_point(); return {{cp, cp}}; }
    }
  }

  CodePointSet parse_class() {
    bool negated = eat('^');
    CodePointSet set;
    bool first = true;
    while (!at_end() && (peek() != ']' || first)) {
      first = false;
      CodePointSet item = class_atom();
      if (item.size() == 1 && item[0].first == item[0].second && !at_end() && peek() == '-' &&
          pos_ + 1 < pattern_.size() && pattern_[pos_ + 1] != ']') {
        ++pos_;
        CodePointSet upper = class_atom();
        if (upper.size() != 1 || upper[0].first != upper[0].second || upper[0].first < item[0].first)
          fail_at("a malformed class range");
        set.emplace_back(item[0].first, upper[0].first);
      } else {
        set.insert(set.end(), item.begin(), item.end());
      }
    }
    if (!eat(']')) fail_at("an unclosed '['");
    set = normalize(set);
    return negated ? negate(set) : set;
  }

  CodePointSet class_atom() {
    if (eat('\\')) {
      if (!at_end() && peek() == 'b') { ++pos_; return {{'\b', '\b'}}; }
      return parse_escape();
    }
    if (!at_end() && peek() == '[' && pos_ + 1 < pattern_.size() && pattern_[pos_ + 1] == ':')
      fail_at("a POSIX class ('[:...:]')");
    uint32_t cp = next_code_point();
    return {{cp, cp}};
  }

  uint32_t next_code_point() {
    auto byte = [&](size_t i) { return static_cast<uint8_t>(pattern_[i]); };
    uint8_t b0 = byte(pos_);
    int length = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
    if (pos_ + length > pattern_.size()) fail_at("invalid UTF-8");
    uint32_t cp = length == 1 ? b0 : length == 2 ? (b0 & 0x1F) : length == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < length; ++i) cp = (cp << 6) | (byte(pos_ + i) & 0x3F);
    pos_ += length;
    return cp;
  }

  static uint32_t hex_value(char c) {
    return isdigit(static_cast<unsigned char>(c)) ? c - '0' : (tolower(static_cast<unsigned char>(c)) - 'a' + 10);
  }
  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !isxdigit(static_cast<unsigned char>(peek()))) fail_at("a malformed hex escape");
      v = v * 16 + hex_value(pattern_[pos_++]);
    }
    return v;
  }

  bool at_end() const { return pos_ >= pattern_.size(); }
  char peek() const { return pattern_[pos_]; }
  bool eat(char c) {
    if (at_end() || peek() != c) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void fail_at(const std::string& what) {
    refuse(keyword_, "the regular expression '" + std::string(pattern_) + "' has " + what + " at offset " +
                         std::to_string(pos_));
  }

  Grammar& g_;
  std::string_view pattern_;
  RegexEncoding encoding_;
  std::string keyword_;
  size_t pos_ = 0;
};

}  // namespace

ExprId regex_to_expr(Grammar& grammar, std::string_view pattern, RegexEncoding encoding, bool search,
                     const std::string& keyword) {
  RegexParser parser(grammar, pattern, encoding, keyword);
  return parser.parse_top(search);
}

}  // namespace beamline
