#include "engine/sampling_params.h"

#include <cmath>

#include "engine/request.h"

namespace beamline {
namespace {

template <typename... Args>
void check(bool condition, const char* param, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw InvalidRequest(param, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace

void validate_sampling_params(const SamplingParams& p, int32_t vocab_size, int32_t max_logprobs) {
  check(p.n >= 1 && p.n <= 128, "n", "n must be between 1 and 128 (got {})", p.n);
  check(std::isfinite(p.temperature) && p.temperature >= 0, "temperature",
        "temperature must be a finite number >= 0 (got {})", p.temperature);
  check(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1, "top_p", "top_p must be in (0, 1] (got {})", p.top_p);
  check(p.top_k >= -1, "top_k", "top_k must be -1 or 0 (off) or a positive count (got {})", p.top_k);
  check(std::isfinite(p.min_p) && p.min_p >= 0 && p.min_p <= 1, "min_p", "min_p must be in [0, 1] (got {})", p.min_p);
  check(std::isfinite(p.presence_penalty) && p.presence_penalty >= -2 && p.presence_penalty <= 2, "presence_penalty",
        "presence_penalty must be in [-2, 2] (got {})", p.presence_penalty);
  check(std::isfinite(p.frequency_penalty) && p.frequency_penalty >= -2 && p.frequency_penalty <= 2,
        "frequency_penalty", "frequency_penalty must be in [-2, 2] (got {})", p.frequency_penalty);
  check(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0 && p.repetition_penalty <= 2,
        "repetition_penalty", "repetition_penalty must be in (0, 2] (got {})", p.repetition_penalty);
  for (const auto& [token, bias] : p.logit_bias) {
    check(token >= 0 && token < vocab_size, "logit_bias", "logit_bias: token id {} is outside the vocabulary [0, {})",
          token, vocab_size);
    check(std::isfinite(bias), "logit_bias", "logit_bias: the bias of token {} is not a finite number", token);
  }
  if (p.max_tokens) check(*p.max_tokens >= 1, "max_tokens", "max_tokens must be at least 1 (got {})", *p.max_tokens);
  check(p.min_tokens >= 0, "min_tokens", "min_tokens must not be negative (got {})", p.min_tokens);
  if (p.max_tokens) {
    check(p.min_tokens <= *p.max_tokens, "min_tokens", "min_tokens ({}) must not exceed max_tokens ({})", p.min_tokens,
          *p.max_tokens);
  }
  for (const std::string& stop : p.stop) check(!stop.empty(), "stop", "stop strings must not be empty");
  for (TokenId token : p.stop_token_ids) {
    check(token >= 0 && token < vocab_size, "stop_token_ids", "stop_token_ids: {} is outside the vocabulary [0, {})",
          token, vocab_size);
  }
  if (p.logprobs) {
    check(*p.logprobs >= 0 && *p.logprobs <= max_logprobs, "logprobs",
          "logprobs (top alternatives per token) must be between 0 and {} (got {})", max_logprobs, *p.logprobs);
  }
  if (p.prompt_logprobs) {
    check(*p.prompt_logprobs >= 0 && *p.prompt_logprobs <= max_logprobs, "prompt_logprobs",
          "prompt_logprobs (top alternatives per prompt token) must be between 0 and {} (got {})", max_logprobs,
          *p.prompt_logprobs);
  }
}

}  // namespace beamline
