#pragma once
// Decides when a sample ends (stop token ids, eos, stop strings, max_tokens) and which text it may emit.
// Stop strings are matched on the detokenized text, so they are found across token boundaries; text that
// could still be the start of a stop string is held back until the next tokens settle it.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "engine/request_output.h"
#include "engine/sampling_params.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

class StopChecker {
 public:
  // `tokenizer` may be null when `detokenize` is false. `eos_token_ids` count unless params.ignore_eos.
  StopChecker(const Tokenizer* tokenizer, bool detokenize, const SamplingParams& params,
              std::span<const TokenId> eos_token_ids, int32_t max_tokens);

  struct Result {
    std::string text;                                   // text that may be emitted now
    std::optional<FinishReason> finish;
    std::variant<std::monostate, TokenId, std::string> stop_reason;
  };
  // Feeds one generated token; `num_output_tokens` counts it.
  Result push(TokenId token, int32_t num_output_tokens);
  // Tokens that must not be sampled while num_output_tokens < min_tokens (eos and stop ids); empty after.
  std::span<const TokenId> masked_tokens(int32_t num_output_tokens) const;

 private:
  bool is_stop_token(TokenId token) const;
  std::string take_text(std::size_t end);  // emits text_[emitted_, end)

  const Tokenizer* tokenizer_;
  std::optional<IncrementalDetokenizer> detokenizer_;
  const SamplingParams& params_;
  std::vector<TokenId> stop_ids_;       // stop_token_ids, plus eos unless ignore_eos
  std::vector<TokenId> min_tokens_mask_;
  int32_t max_tokens_;
  std::size_t longest_stop_ = 0;
  std::string text_;                    // all text so far
  std::size_t emitted_ = 0;             // bytes of text_ already returned
};

}  // namespace beamline
