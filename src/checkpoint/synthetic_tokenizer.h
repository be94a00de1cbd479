#pragma once
// A small byte-level BPE tokenizer.json (Hugging Face format, shaped like gpt-oss's) for random-weights
// checkpoints: the 256 byte tokens as ids 0..255 (spelled with GPT-2's byte-to-unicode map), then tokens
// from merges learned on a built-in English text (and, past what that text supports, filler merges that
// append a letter to an existing token), and the Harmony special tokens at the top ids of the vocabulary.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace beamline {

// <|startoftext|> <|endoftext|> <|return|> <|constrain|> <|channel|> <|start|> <|end|> <|message|> <|call|>:
// in id order, occupying ids [vocab_size - 9, vocab_size).
const std::vector<std::string>& harmony_special_tokens();
// Throws beamline::Error for a string that is not one of harmony_special_tokens().
int64_t harmony_special_token_id(int64_t vocab_size, std::string_view token);

inline constexpr int64_t kMinSyntheticTokenizerVocab = 256 + 9;  // every byte plus the specials

// The tokenizer.json text; throws below kMinSyntheticTokenizerVocab. Deterministic.
std::string synthetic_tokenizer_json(int64_t vocab_size);

// The UTF-8 spelling of a raw byte in byte-level BPE vocabularies (GPT-2's bytes_to_unicode).
std::string byte_level_spelling(uint8_t byte);

}  // namespace beamline
