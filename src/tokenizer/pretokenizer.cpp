#include "tokenizer/pretokenizer.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstdint>

#include "tokenizer/char_classes.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beamline::text {

const std::string_view kO200kPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const std::string_view kO200kPatternSpelledOut =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const std::string_view kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

// The o200k pattern by hand. Each alternative's backtracking is resolved in closed form; the
// alternatives are tried in the pattern's order, so the result is the regex's leftmost-first match:
//   A1 [^\r\n\p{L}\p{N}]? U* L+ C?     A2 [^\r\n\p{L}\p{N}]? U+ L* C?     A3 \p{N}{1,3}
//   A4  ?[^\s\p{L}\p{N}]+[\r\n/]*      A5 \s*[\r\n]+   A6 \s+(?!\S)   A7 \s+
// with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], L = [\p{Ll}\p{Lm}\p{Lo}\p{M}], C = a contraction ('s, 't, ...).
class O200kPreTokenizer final : public PreTokenizer {
 public:
  explicit O200kPreTokenizer(bool contraction_matches_long_s)
      : contraction_matches_long_s_(contraction_matches_long_s), classes_(CharClassTable::instance()) {}

  void split(std::string_view text, std::vector<std::size_t>& ends) const override {
    const Text t{reinterpret_cast<const unsigned char*>(text.data()), text.size()};
    for (std::size_t position = 0; position < t.size;) {
      position = match_end(t, position);
      ends.push_back(position);
    }
  }

 private:
  struct Text {
    const unsigned char* bytes;
    std::size_t size;
  };
  struct Char {
    uint8_t classes;
    uint32_t length;
    char32_t code_point;
  };
  // End offsets of A1 and A2 started at one position; 0 when the alternative does not match.
  struct LetterMatches {
    std::size_t first = 0;
    std::size_t second = 0;
  };

  // A maximal invalid subpart has no class, like the U+FFFD (a symbol) it stands for.
  Char at(const Text& t, std::size_t i) const {
    const unsigned byte = t.bytes[i];
    if (byte < 0x80) return {classes_.ascii(byte), 1, byte};
    const Utf8Char c = decode_utf8(t.bytes + i, t.bytes + t.size);
    if (c.code_point == kInvalidCodePoint) return {0, c.length, c.code_point};
    return {classes_(c.code_point), c.length, c.code_point};
  }

  static bool is_symbol(const Char& c) { return (c.classes & (kWhitespace | kLetter | kNumber)) == 0; }

  std::size_t contraction_end(const Text& t, std::size_t i) const {
    if (i + 1 >= t.size || t.bytes[i] != '\'') return i;
    const unsigned first = t.bytes[i + 1] | 0x20;  // ASCII lower case; only letters are compared below
    if (first == 's' || first == 't' || first == 'm' || first == 'd') return i + 2;
    if (i + 2 >= t.size) return i;
    const unsigned second = t.bytes[i + 2] | 0x20;
    if ((first == 'r' || first == 'v') && second == 'e') return i + 3;
    if (first == 'l' && second == 'l') return i + 3;
    if (contraction_matches_long_s_ && t.bytes[i + 1] == 0xC5 && t.bytes[i + 2] == 0xBF) return i + 3;
    return i;
  }

  LetterMatches letters(const Text& t, std::size_t start) const {
    std::size_t upper_end = start, last_in_both_end = 0;
    while (upper_end < t.size) {
      const Char c = at(t, upper_end);
      if ((c.classes & kUpperLike) == 0) break;
      upper_end += c.length;
      if (c.classes & kLowerLike) last_in_both_end = upper_end;
    }
    std::size_t lower_end = upper_end;
    while (lower_end < t.size) {
      const Char c = at(t, lower_end);
      if ((c.classes & kLowerLike) == 0) break;
      lower_end += c.length;
    }
    LetterMatches matches;
    // A1: U* takes the whole U run when L+ can follow; otherwise it gives back down to the last
    // character that is in both classes, which then is L+ on its own.
    if (lower_end > upper_end) {
      matches.first = contraction_end(t, lower_end);
    } else if (last_in_both_end != 0) {
      matches.first = contraction_end(t, last_in_both_end);
    }
    if (upper_end > start) matches.second = contraction_end(t, lower_end);
    return matches;
  }

  std::size_t symbols_end(const Text& t, std::size_t i) const {
    while (i < t.size) {
      const Char c = at(t, i);
      if (!is_symbol(c)) break;
      i += c.length;
    }
    while (i < t.size && (t.bytes[i] == '\r' || t.bytes[i] == '\n' || t.bytes[i] == '/')) ++i;
    return i;
  }

  std::size_t match_end(const Text& t, std::size_t start) const {
    const Char c0 = at(t, start);
    if (c0.classes & kLetter) {
      const LetterMatches matches = letters(t, start);
      return matches.first != 0 ? matches.first : matches.second;
    }
    const bool may_be_prefix = (c0.classes & kNumber) == 0 && c0.code_point != '\r' && c0.code_point != '\n';
    if (may_be_prefix) {
      const std::size_t after = start + c0.length;
      const LetterMatches with_prefix = after < t.size ? letters(t, after) : LetterMatches{};
      if (with_prefix.first != 0) return with_prefix.first;
      // A mark is not a letter, so it can be the optional prefix and also start U or L itself.
      const LetterMatches without_prefix =
          (c0.classes & (kUpperLike | kLowerLike)) != 0 ? letters(t, start) : LetterMatches{};
      if (without_prefix.first != 0) return without_prefix.first;
      if (with_prefix.second != 0) return with_prefix.second;
      if (without_prefix.second != 0) return without_prefix.second;
    }
    if (c0.classes & kNumber) {
      std::size_t end = start + c0.length;
      for (int count = 1; count < 3 && end < t.size; ++count) {
        const Char c = at(t, end);
        if ((c.classes & kNumber) == 0) break;
        end += c.length;
      }
      return end;
    }
    if (c0.code_point == ' ' && start + 1 < t.size) {
      const Char next = at(t, start + 1);
      if (is_symbol(next)) return symbols_end(t, start + 1 + next.length);
    }
    if (is_symbol(c0)) return symbols_end(t, start + c0.length);
    // Whitespace. A5 ends after the run's last line break; A6 leaves the run's last character to the
    // next piece when something follows; A7 takes a lone character.
    std::size_t end = start, last_line_break_end = 0, last_start = start;
    while (end < t.size) {
      const Char c = at(t, end);
      if ((c.classes & kWhitespace) == 0) break;
      last_start = end;
      end += c.length;
      if (c.code_point == '\r' || c.code_point == '\n') last_line_break_end = end;
    }
    if (last_line_break_end != 0) return last_line_break_end;
    if (end == t.size || last_start == start) return end;
    return last_start;
  }

  bool contraction_matches_long_s_;
  const CharClassTable& classes_;
};

// Rewrites `\s` and `\S` to the White_Space class (PCRE2's \s differs from it at U+180E).
std::string with_white_space_classes(std::string_view pattern, std::string_view where) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[++i];
      if (escaped == 's' || escaped == 'S') {
        require(escaped == 's' || !in_class, "{}: \\S inside a character class is not supported in split pattern",
                where);
        if (!in_class) out += escaped == 's' ? "[" : "[^";
        out += kWhitespaceClassBody;
        if (!in_class) out += ']';
      } else {
        out += c;
        out += escaped;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const std::size_t close = pattern.find(":]", i + 2);
      require(close != std::string_view::npos, "{}: unterminated POSIX class in split pattern", where);
      out.append(pattern.substr(i, close + 2 - i));
      i = close + 1;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

class RegexPreTokenizer final : public PreTokenizer {
 public:
  RegexPreTokenizer(std::string_view pattern, std::string_view where) {
    const std::string rewritten = with_white_space_classes(pattern, where);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(), PCRE2_UTF | PCRE2_UCP,
                          &error_code, &error_offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof message);
      fail("{}: split pattern does not compile: {} (pattern {})", where, reinterpret_cast<const char*>(message),
           pattern);
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~RegexPreTokenizer() override { pcre2_code_free(code_); }
  RegexPreTokenizer(const RegexPreTokenizer&) = delete;
  RegexPreTokenizer& operator=(const RegexPreTokenizer&) = delete;

  void split(std::string_view text, std::vector<std::size_t>& ends) const override {
    if (is_valid_utf8(text)) {
      split_valid(text, ends, nullptr);
      return;
    }
    // Match on the lossy text and map the boundaries back to the raw bytes.
    std::string lossy;
    std::vector<std::size_t> raw_offset;  // raw offset of each lossy byte, plus the end
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
    for (std::size_t p = 0; p < text.size();) {
      const Utf8Char c = decode_utf8(bytes + p, bytes + text.size());
      const std::size_t before = lossy.size();
      if (c.code_point == kInvalidCodePoint) {
        append_utf8(lossy, 0xFFFD);
      } else {
        lossy.append(text.substr(p, c.length));
      }
      raw_offset.resize(lossy.size(), p);
      for (std::size_t k = before + 1; k < lossy.size() && c.code_point != kInvalidCodePoint; ++k) {
        raw_offset[k] = p + (k - before);
      }
      p += c.length;
    }
    raw_offset.push_back(text.size());
    split_valid(lossy, ends, &raw_offset);
  }

 private:
  void split_valid(std::string_view text, std::vector<std::size_t>& ends,
                   const std::vector<std::size_t>* raw_offset) const {
    thread_local std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match{
        pcre2_match_data_create(1, nullptr), &pcre2_match_data_free};
    const auto emit = [&](std::size_t end) { ends.push_back(raw_offset ? (*raw_offset)[end] : end); };
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t search_from = 0, piece_start = 0;
    while (search_from < text.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), search_from, 0, match.get(), nullptr)
                          : pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, match.get(),
                                        nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      require(rc >= 0, "split pattern failed to match (PCRE2 error {}) at byte {}", rc, search_from);
      const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match.get());
      if (range[1] == range[0]) {  // empty match: look again one character further
        const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
        search_from = range[0] + decode_utf8(bytes + range[0], bytes + text.size()).length;
        continue;
      }
      if (range[0] > piece_start) emit(range[0]);
      emit(range[1]);
      piece_start = search_from = range[1];
    }
    if (piece_start < text.size()) emit(text.size());
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

class PreTokenizerSequence final : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}

  void split(std::string_view text, std::vector<std::size_t>& ends) const override {
    const std::size_t first = ends.size();
    ends.push_back(text.size());
    std::vector<std::size_t> current, pieces;
    for (const auto& step : steps_) {
      current.assign(ends.begin() + static_cast<std::ptrdiff_t>(first), ends.end());
      ends.resize(first);
      std::size_t piece_start = 0;
      for (const std::size_t piece_end : current) {
        pieces.clear();
        step->split(text.substr(piece_start, piece_end - piece_start), pieces);
        for (const std::size_t end : pieces) ends.push_back(piece_start + end);
        piece_start = piece_end;
      }
    }
    if (text.empty()) ends.resize(first);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_regex_pretokenizer(std::string_view pattern, std::string_view where) {
  return std::make_unique<RegexPreTokenizer>(pattern, where);
}

std::unique_ptr<PreTokenizer> make_pretokenizer(std::string_view pattern, std::string_view where) {
  if (pattern == kO200kPattern) return std::make_unique<O200kPreTokenizer>(true);
  if (pattern == kO200kPatternSpelledOut) return std::make_unique<O200kPreTokenizer>(false);
  return make_regex_pretokenizer(pattern, where);
}

std::unique_ptr<PreTokenizer> make_pretokenizer_sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) {
  if (steps.size() == 1) return std::move(steps.front());
  return std::make_unique<PreTokenizerSequence>(std::move(steps));
}

}  // namespace beamline::text
