#include "tokenizer/char_classes.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <array>
#include <map>
#include <string>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beamline::text {

const char* const kWhitespaceClassBody =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

namespace {

constexpr char32_t kWhiteSpaceCodePoints[] = {0x09, 0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,   0xA0,   0x1680,
                                    0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                                    0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};

// Planes 4-13 are unassigned and planes 15-16 are private use, so none of their code points is in a class.
bool may_have_class(char32_t cp) { return cp < 0x40000 || (cp >= 0xE0000 && cp < 0xE1000); }

// Marks with `bit` every code point of `all` (all candidate code points, UTF-8, in order) that `pattern` matches.
void mark_class(const std::string& all, const char* pattern, uint8_t bit, std::vector<uint8_t>& classes) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &error_code, &error_offset, nullptr);
  require(code != nullptr, "PCRE2 cannot compile the built-in class pattern {}", pattern);
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(all.data());
  const auto* bytes = reinterpret_cast<const unsigned char*>(all.data());
  PCRE2_SIZE offset = 0;
  while (offset < all.size() &&
         pcre2_match(code, subject, all.size(), offset, PCRE2_NO_UTF_CHECK, match, nullptr) > 0) {
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match);
    for (PCRE2_SIZE p = range[0]; p < range[1];) {
      const Utf8Char c = decode_utf8(bytes + p, bytes + range[1]);
      classes[c.code_point] |= bit;
      p += c.length;
    }
    offset = range[1] > range[0] ? range[1] : range[0] + 1;
  }
  pcre2_match_data_free(match);
  pcre2_code_free(code);
}

}  // namespace

CharClassTable::CharClassTable() {
  std::string all;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (may_have_class(cp) && (cp < 0xD800 || cp > 0xDFFF)) append_utf8(all, cp);
  }
  std::vector<uint8_t> classes(0x110000, 0);
  mark_class(all, "\\p{L}+", kLetter, classes);
  mark_class(all, "\\p{N}+", kNumber, classes);
  mark_class(all, "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+", kUpperLike, classes);
  mark_class(all, "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+", kLowerLike, classes);
  for (char32_t cp : kWhiteSpaceCodePoints) classes[cp] |= kWhitespace;

  for (char32_t cp = 0; cp < 0x80; ++cp) ascii_[cp] = classes[cp];
  // Two-stage table: identical 256-code-point blocks are stored once.
  std::map<std::array<uint8_t, 256>, uint16_t> known_blocks;
  for (std::size_t block = 0; block < 0x1100; ++block) {
    std::array<uint8_t, 256> content;
    for (std::size_t i = 0; i < 256; ++i) content[i] = classes[block * 256 + i];
    auto [it, inserted] = known_blocks.try_emplace(content, static_cast<uint16_t>(known_blocks.size()));
    if (inserted) blocks_.insert(blocks_.end(), content.begin(), content.end());
    block_index_[block] = it->second;
  }
}

const CharClassTable& CharClassTable::instance() {
  static const CharClassTable table;
  return table;
}

}  // namespace beamline::text
