#pragma once
// The byte-level BPE tokenizer behind both loaders: a vocabulary of byte strings, a merge table,
// a pre-tokenizer and added (special) tokens.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace beamline::text {

struct AddedToken {
  std::string text;
  TokenId id;
  // Special tokens are recognized in text only when the caller allows them; other added tokens always are
  // (as Hugging Face does).
  bool special;
};

struct BpeDefinition {
  std::string source;  // the file, for error messages
  std::vector<std::pair<std::string, TokenId>> vocab;  // raw token bytes and id; all 256 single bytes needed
  enum class MergeRule {
    // `merges` in rank order (Hugging Face).
    kMergeList,
    // Any two adjacent tokens whose concatenation is a token merge, ranked by that token's id (tiktoken).
    kTokenRanks,
  } merge_rule = MergeRule::kMergeList;
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes of the two halves
  // A piece that is itself a token becomes that token without merging (tiktoken; ignore_merges in HF).
  bool whole_piece_lookup = false;
  bool add_prefix_space = false;  // HF ByteLevel: a space before text that does not start with one
  std::vector<AddedToken> added_tokens;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeDefinition definition);

// Printable form of raw token bytes for messages: printable ASCII as is, everything else as \xNN.
std::string escape_bytes(std::string_view bytes);

}  // namespace beamline::text
