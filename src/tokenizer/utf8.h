#pragma once
// UTF-8 decoding with the "maximal subpart" rule that lossy decoders (Python, Rust, WHATWG) share:
// each maximal invalid subsequence stands for one U+FFFD. The tokenizer splits malformed input as if
// those subsequences were U+FFFD while keeping the raw bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace beamline::text {

inline constexpr char32_t kInvalidCodePoint = 0xFFFFFFFF;

struct Utf8Char {
  char32_t code_point;  // kInvalidCodePoint for a maximal invalid subpart
  uint32_t length;      // bytes, at least 1
};

// Decodes the sequence starting at p (p < end).
inline Utf8Char decode_utf8(const unsigned char* p, const unsigned char* end) {
  const unsigned lead = p[0];
  if (lead < 0x80) return {lead, 1};
  uint32_t need;
  char32_t value;
  unsigned second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
    value = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    value = lead & 0x0F;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    value = lead & 0x07;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;  // nothing above U+10FFFF
  } else {
    return {kInvalidCodePoint, 1};
  }
  uint32_t length = 1;
  for (uint32_t i = 0; i < need; ++i) {
    if (p + length >= end) return {kInvalidCodePoint, length};
    const unsigned byte = p[length];
    const unsigned low = i == 0 ? second_low : 0x80, high = i == 0 ? second_high : 0xBF;
    if (byte < low || byte > high) return {kInvalidCodePoint, length};
    value = (value << 6) | (byte & 0x3F);
    ++length;
  }
  return {value, length};
}

bool is_valid_utf8(std::string_view text);

// Each maximal invalid subpart replaced by U+FFFD.
std::string replace_invalid_utf8(std::string_view text);

// Length of the tail of `bytes` that is an incomplete but still completable UTF-8 sequence (0 to 3).
std::size_t incomplete_utf8_tail(std::string_view bytes);

void append_utf8(std::string& out, char32_t code_point);

}  // namespace beamline::text
