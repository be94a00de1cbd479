#pragma once
// The Unicode character classes the o200k split pattern uses, as one table lookup per code point.
// Letters, numbers, cases and marks come from PCRE2's Unicode tables (so the hand-written splitter and
// the PCRE2 path agree on the Unicode version); whitespace is the Unicode White_Space property, which is
// what `\s` means in tiktoken's regex engine.
#include <cstdint>
#include <vector>

namespace beamline::text {

enum CharClass : uint8_t {
  kLetter = 1,      // \p{L}
  kNumber = 2,      // \p{N}
  kUpperLike = 4,   // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
  kLowerLike = 8,   // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
  kWhitespace = 16  // White_Space
};

class CharClassTable {
 public:
  static const CharClassTable& instance();

  uint8_t ascii(unsigned byte) const { return ascii_[byte]; }
  uint8_t operator()(char32_t code_point) const {
    if (code_point < 0x80) return ascii_[code_point];
    if (code_point > 0x10FFFF) return 0;
    return blocks_[block_index_[code_point >> 8] * 256 + (code_point & 0xFF)];
  }

 private:
  CharClassTable();
  uint8_t ascii_[128];
  uint16_t block_index_[0x1100];
  std::vector<uint8_t> blocks_;
};

// The White_Space code points, as a regex character-class body (usable inside or outside [...]).
extern const char* const kWhitespaceClassBody;

}  // namespace beamline::text
