#pragma once
// A tokenizer over a fixed table of byte pieces, for tests that need detokenization.
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace beamline::testing {

class FakeTokenizer : public Tokenizer {
 public:
  // Ids are indices into `pieces`; ids in `specials` are special tokens.
  FakeTokenizer(std::vector<std::string> pieces, std::vector<TokenId> specials)
      : pieces_(std::move(pieces)), specials_(std::move(specials)) {}

  std::vector<TokenId> encode(std::string_view, bool) const override { throw std::logic_error("not used"); }
  std::string decode_bytes(const std::vector<TokenId>& ids) const override {
    std::string out;
    for (TokenId id : ids) out += token_bytes(id);
    return out;
  }
  std::string_view token_bytes(TokenId id) const override { return pieces_.at(static_cast<std::size_t>(id)); }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      if (pieces_[i] == token) return static_cast<TokenId>(i);
    }
    return std::nullopt;
  }
  bool is_special(TokenId id) const override {
    return std::find(specials_.begin(), specials_.end(), id) != specials_.end();
  }
  std::size_t vocab_size() const override { return pieces_.size(); }

 private:
  std::vector<std::string> pieces_;
  std::vector<TokenId> specials_;
};

}  // namespace beamline::testing
