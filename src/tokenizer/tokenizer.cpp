#include "tokenizer/tokenizer.h"

#include "tokenizer/utf8.h"

namespace beamline {

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const {
  return text::replace_invalid_utf8(decode_bytes(ids));
}

// Text goes out up to the last complete character; an incomplete sequence at the end waits for the
// next token. A sequence that can no longer become valid goes out as U+FFFD (one per maximal invalid
// subpart), so the pieces always concatenate to decode() of all ids so far.
std::string IncrementalDetokenizer::push(TokenId id) {
  pending_ += tokenizer_.token_bytes(id);
  const std::size_t ready = pending_.size() - text::incomplete_utf8_tail(pending_);
  std::string out = text::replace_invalid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = text::replace_invalid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace beamline
