#pragma once
// Byte-level BPE tokenizer: Hugging Face tokenizer.json or a tiktoken rank file + split regex + specials.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace beamline {

using TokenId = int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Special-token strings in `text` become special ids only when allow_special is true; otherwise they
  // are encoded as ordinary text. Malformed UTF-8 is encoded byte for byte (byte-level BPE covers it).
  virtual std::vector<TokenId> encode(std::string_view text, bool allow_special = false) const = 0;
  // Raw bytes of the tokens (may be invalid UTF-8 when a character is split); throws on an unknown id.
  virtual std::string decode_bytes(const std::vector<TokenId>& ids) const = 0;
  // Raw bytes of one token (a special token's text for a special); throws on an unknown id.
  virtual std::string_view token_bytes(TokenId id) const = 0;
  // decode_bytes with invalid UTF-8 replaced by U+FFFD.
  std::string decode(const std::vector<TokenId>& ids) const;

  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;  // specials included
  virtual bool is_special(TokenId id) const = 0;
  virtual std::size_t vocab_size() const = 0;  // one past the largest id

  // Loaders; errors name the file and what is wrong in it.
  static std::unique_ptr<Tokenizer> from_tokenizer_json(const std::filesystem::path& path);
  // `encoding` is "o200k_base" or "o200k_harmony" (fixes the split regex and the special-token table).
  static std::unique_ptr<Tokenizer> from_tiktoken(const std::filesystem::path& ranks, std::string_view encoding);
};

// Streaming detokenizer: feed ids one at a time, get back the text that became complete UTF-8;
// never splits a character across two returned pieces.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(TokenId id);
  std::string flush();  // whatever is held back, invalid bytes replaced by U+FFFD

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace beamline
