#include "tokenizer/utf8.h"

#include <cstring>

namespace beamline::text {

namespace {
const unsigned char* bytes_of(std::string_view text) { return reinterpret_cast<const unsigned char*>(text.data()); }
}  // namespace

bool is_valid_utf8(std::string_view text) {
  const unsigned char* p = bytes_of(text);
  const unsigned char* end = p + text.size();
  while (p < end) {
    // Eight ASCII bytes at a time: the common case for prose and code.
    while (end - p >= 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      if (word & 0x8080808080808080ULL) break;
      p += 8;
    }
    if (p == end) break;
    const Utf8Char c = decode_utf8(p, end);
    if (c.code_point == kInvalidCodePoint) return false;
    p += c.length;
  }
  return true;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string replace_invalid_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  const unsigned char* begin = bytes_of(text);
  const unsigned char* end = begin + text.size();
  for (const unsigned char* p = begin; p < end;) {
    const Utf8Char c = decode_utf8(p, end);
    if (c.code_point == kInvalidCodePoint) {
      append_utf8(out, 0xFFFD);
    } else {
      out.append(reinterpret_cast<const char*>(p), c.length);
    }
    p += c.length;
  }
  return out;
}

std::size_t incomplete_utf8_tail(std::string_view bytes) {
  const unsigned char* begin = bytes_of(bytes);
  const unsigned char* end = begin + bytes.size();
  // A sequence is at most 4 bytes, so an incomplete one starts within the last 3.
  for (std::size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const unsigned char* start = end - back;
    if ((*start & 0xC0) == 0x80) continue;  // continuation byte: the lead is further back
    const Utf8Char c = decode_utf8(start, end);
    // Invalid only because the bytes ran out: the decoder consumed everything that was there.
    return c.code_point == kInvalidCodePoint && start + c.length == end && *start >= 0xC2 && *start <= 0xF4 ? back : 0;
  }
  return 0;
}

}  // namespace beamline::text
