#pragma once
// Log-probabilities of sampled tokens in the two OpenAI response shapes.
#include <string>
#include <vector>

#include "engine/request_output.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace beamline::server {

// A token's text for display: its bytes, with a split character shown as U+FFFD.
std::string token_text(const Tokenizer& tokenizer, TokenId id);

// Chat Completions: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
Json chat_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& logprobs);

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}; offsets count
// bytes of the choice's text from `text_offset`.
Json completion_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& logprobs,
                              std::size_t text_offset);

// vLLM's prompt_logprobs: per prompt token null (the first) or {"<id>": {"logprob", "rank", "decoded_token"}} holding
// the prompt token and the top alternatives (ranks from 1, best first).
Json prompt_logprobs_json(const Tokenizer& tokenizer, const std::vector<std::optional<TokenLogprob>>& logprobs);

}  // namespace beamline::server
