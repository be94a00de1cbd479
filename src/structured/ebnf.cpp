#include "structured/ebnf.h"

#include <cctype>

#include "structured/regex.h"
#include "tokenizer/utf8.h"

namespace beamline {

namespace {

class EbnfParser {
 public:
  EbnfParser(Grammar& g, std::string_view text) : g_(g), text_(text) {}

  void parse() {
    skip_space();
    while (!at_end()) {
      std::string name = parse_name();
      skip_space();
      if (!eat_string("::=")) fail("expected '::=' after the rule name '" + name + "'");
      RuleId rule = rule_named(name);
      if (defined_.size() <= static_cast<size_t>(rule)) defined_.resize(rule + 1, 0);
      if (defined_[rule]) fail("the rule '" + name + "' is defined twice");
      defined_[rule] = 1;
      g_.set_body(rule, parse_alternatives());
    }
    for (RuleId r = 0; r < g_.num_rules(); ++r)
      if (static_cast<size_t>(r) >= defined_.size() || !defined_[r])
        fail("the rule '" + g_.rule_name(r) + "' is used but never defined");
  }

 private:
  RuleId rule_named(const std::string& name) {
    RuleId r = g_.find_rule(name);
    return r >= 0 ? r : g_.add_rule(name);
  }

  ExprId parse_alternatives() {
    std::vector<ExprId> alternatives = {parse_sequence()};
    while (eat('|')) alternatives.push_back(parse_sequence());
    return g_.choice(std::move(alternatives));
  }

  // A sequence stops at `|`, `)`, the end, or the start of the next rule (`name ::=`).
  ExprId parse_sequence() {
    std::vector<ExprId> items;
    for (;;) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      items.push_back(parse_postfix(parse_primary()));
    }
    return g_.sequence(std::move(items));
  }

  bool at_rule_start() {
    size_t saved = pos_;
    bool is_start = false;
    if (is_name_char(peek())) {
      while (!at_end() && is_name_char(peek())) ++pos_;
      skip_space();
      is_start = text_.substr(pos_, 3) == "::=";
    }
    pos_ = saved;
    return is_start;
  }

  ExprId parse_primary() {
    char c = peek();
    if (c == '"' || c == '\'') return parse_literal(c);
    if (c == '[') return parse_class();
    if (c == '.') { ++pos_; return code_points(g_, {{0, 0x10FFFF}}, RegexEncoding::kUtf8); }
    if (c == '(') {
      ++pos_;
      ExprId inner = parse_alternatives();
      skip_space();
      if (!eat(')')) fail("expected ')'");
      return inner;
    }
    if (is_name_char(c)) return g_.rule_ref(rule_named(parse_name()));
    fail(std::string("unexpected '") + c + "'");
  }

  ExprId parse_postfix(ExprId item) {
    for (;;) {
      if (eat('*')) item = g_.star(item);
      else if (eat('+')) item = g_.repeat(item, 1, -1);
      else if (eat('?')) item = g_.optional(item);
      else if (!at_end() && peek() == '{') {
        ++pos_;
        int32_t lo = parse_count(), hi = lo;
        if (eat(',')) hi = (!at_end() && peek() == '}') ? -1 : parse_count();
        if (!eat('}') || (hi >= 0 && hi < lo)) fail("malformed {n,m}");
        item = g_.repeat(item, lo, hi);
      } else {
        return item;
      }
    }
  }

  int32_t parse_count() {
    size_t start = pos_;
    int64_t v = 0;
    while (!at_end() && isdigit(static_cast<unsigned char>(peek()))) v = std::min<int64_t>(v * 10 + (text_[pos_++] - '0'), 100000);
    if (pos_ == start) fail("expected a number in {n,m}");
    if (v > 10000) fail("a repetition count over 10000");
    return static_cast<int32_t>(v);
  }

  ExprId parse_literal(char quote) {
    ++pos_;
    std::string bytes;
    while (!at_end() && peek() != quote) {
      uint32_t cp = parse_char();
      text::append_utf8(bytes, cp);
    }
    if (!eat(quote)) fail("unterminated string");
    return g_.literal(bytes);
  }

  ExprId parse_class() {
    ++pos_;
    bool negated = eat('^');
    CodePointSet set;
    while (!at_end() && peek() != ']') {
      uint32_t lo = parse_char(), hi = lo;
      if (!at_end() && peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail("a character range whose end is below its start");
      }
      set.emplace_back(lo, hi);
    }
    if (!eat(']')) fail("unterminated character class");
    return code_points(g_, negated ? negate(set) : normalize(set), RegexEncoding::kUtf8);
  }

  uint32_t parse_char() {
    char c = text_[pos_++];
    if (c != '\\') {
      --pos_;
      uint8_t b0 = static_cast<uint8_t>(text_[pos_]);
      int length = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
      if (pos_ + length > text_.size()) fail("invalid UTF-8");
      uint32_t cp = length == 1 ? b0 : length == 2 ? (b0 & 0x1F) : length == 3 ? (b0 & 0x0F) : (b0 & 0x07);
      for (int i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text_[pos_ + i]) & 0x3F);
      pos_ += length;
      return cp;
    }
    if (at_end()) fail("a trailing backslash");
    char e = text_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'x': return parse_hex(2);
      case 'u': return parse_hex(4);
      case 'U': return parse_hex(8);
      default: return static_cast<uint8_t>(e);
    }
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !isxdigit(static_cast<unsigned char>(peek()))) fail("malformed hex escape");
      char c = text_[pos_++];
      v = v * 16 + (isdigit(static_cast<unsigned char>(c)) ? c - '0' : (tolower(static_cast<unsigned char>(c)) - 'a' + 10));
    }
    return v;
  }

  std::string parse_name() {
    size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  static bool is_name_char(char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }
  void skip_space() {
    while (!at_end()) {
      if (isspace(static_cast<unsigned char>(peek()))) ++pos_;
      else if (peek() == '#') while (!at_end() && peek() != '\n') ++pos_;
      else break;
    }
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  bool eat(char c) {
    skip_space();
    if (at_end() || peek() != c) return false;
    ++pos_;
    return true;
  }
  bool eat_string(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  [[noreturn]] void fail(const std::string& what) {
    refuse("grammar", "EBNF at offset " + std::to_string(pos_) + ": " + what);
  }

  Grammar& g_;
  std::string_view text_;
  size_t pos_ = 0;
  std::vector<uint8_t> defined_;
};

}  // namespace

Grammar ebnf_grammar(std::string_view text, std::string_view root_rule) {
  Grammar g;
  EbnfParser(g, text).parse();
  RuleId root = g.find_rule(root_rule);
  if (root < 0) refuse("grammar", "EBNF has no '" + std::string(root_rule) + "' rule");
  g.set_root(root);
  return g;
}

}  // namespace beamline
