#pragma once
// A byte-level tokenizer for Harmony tests that need no rank data: ids 0-255 are single bytes, the
// Harmony special tokens follow. Every multi-byte character is split across tokens, which is what the
// streaming tests want; special tokens sit at ids unlike o200k_harmony's, which catches hard-coded ids.
#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "tokenizer/tokenizer.h"

namespace beamline::harmony::testing {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr std::array<const char*, 9> kSpecials = {"<|startoftext|>", "<|endoftext|>", "<|return|>",
                                                            "<|constrain|>",   "<|channel|>",   "<|start|>",
                                                            "<|end|>",         "<|message|>",   "<|call|>"};
  static constexpr TokenId kFirstSpecial = 300;

  std::vector<TokenId> encode(std::string_view text, bool allow_special) const override {
    std::vector<TokenId> ids;
    std::size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      if (allow_special && text[i] == '<') {
        for (std::size_t s = 0; s < kSpecials.size(); ++s) {
          const std::string_view special = kSpecials[s];
          if (text.substr(i, special.size()) == special) {
            ids.push_back(kFirstSpecial + static_cast<TokenId>(s));
            i += special.size();
            matched = true;
            break;
          }
        }
      }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }

  std::string decode_bytes(const std::vector<TokenId>& ids) const override {
    std::string bytes;
    for (TokenId id : ids) bytes += token_bytes(id);
    return bytes;
  }

  std::string_view token_bytes(TokenId id) const override {
    if (id >= 0 && id < 256) return std::string_view(&bytes_[static_cast<std::size_t>(id)], 1);
    if (is_special(id)) return kSpecials[static_cast<std::size_t>(id - kFirstSpecial)];
    throw std::out_of_range("unknown token id " + std::to_string(id));
  }

  std::optional<TokenId> token_to_id(std::string_view token) const override {
    for (std::size_t s = 0; s < kSpecials.size(); ++s) {
      if (token == kSpecials[s]) return kFirstSpecial + static_cast<TokenId>(s);
    }
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }

  bool is_special(TokenId id) const override {
    return id >= kFirstSpecial && id < kFirstSpecial + static_cast<TokenId>(kSpecials.size());
  }

  std::size_t vocab_size() const override { return kFirstSpecial + kSpecials.size(); }

 private:
  std::array<char, 256> bytes_ = [] {
    std::array<char, 256> bytes{};
    for (int i = 0; i < 256; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>(i);
    return bytes;
  }();

};

}  // namespace beamline::harmony::testing
