#include "engine/request.h"

#include <algorithm>

#include "structured/token_mask.h"

namespace beamline {

void validate_request(const GenerationRequest& request, const RequestLimits& limits) {
  const auto prompt_length = static_cast<int64_t>(request.prompt.size());
  if (prompt_length == 0) throw InvalidRequest("prompt", "the prompt is empty: at least one token is needed");
  const auto bad = std::find_if(request.prompt.begin(), request.prompt.end(),
                                [&](TokenId t) { return t < 0 || t >= limits.vocab_size; });
  if (bad != request.prompt.end()) {
    throw InvalidRequest("prompt", fmt::format("prompt token {} (at index {}) is outside the vocabulary [0, {})", *bad,
                                               bad - request.prompt.begin(), limits.vocab_size));
  }
  if (prompt_length >= limits.max_model_len) {
    throw InvalidRequest("prompt", fmt::format("the prompt has {} tokens; this model's context is {} tokens, which "
                                               "leaves no room for output",
                                               prompt_length, limits.max_model_len));
  }
  validate_sampling_params(request.sampling, limits.vocab_size, limits.max_logprobs);
  if (request.sampling.max_tokens && prompt_length + *request.sampling.max_tokens > limits.max_model_len) {
    throw InvalidRequest("max_tokens", fmt::format("max_tokens {} plus the prompt's {} tokens exceed the context of {} "
                                                   "tokens (at most {} here)",
                                                   *request.sampling.max_tokens, prompt_length, limits.max_model_len,
                                                   limits.max_model_len - prompt_length));
  }
  if (!limits.has_tokenizer && !request.sampling.stop.empty()) {
    throw InvalidRequest("stop", "stop strings need a tokenizer, and this engine has none");
  }
  if (!request.detokenize && !request.sampling.stop.empty()) {
    throw InvalidRequest("stop", "stop strings need detokenized output");
  }
  if (request.return_routed_experts && !limits.routed_experts_enabled) {
    throw InvalidRequest("return_routed_experts",
                         "return_routed_experts needs the server started with --enable-return-routed-experts");
  }
  if (!limits.has_tokenizer && request.detokenize) {
    throw InvalidRequest("detokenize", "text output needs a tokenizer, and this engine has none");
  }
  if (request.grammar && (request.grammar->vocabulary() == nullptr ||
                          request.grammar->vocabulary()->size() > limits.vocab_size)) {
    throw InvalidRequest("structured_outputs", fmt::format("the grammar was compiled for another vocabulary than this "
                                                           "model's {} tokens", limits.vocab_size));
  }
}

int32_t effective_max_tokens(const GenerationRequest& request, int64_t max_model_len) {
  if (request.sampling.max_tokens) return *request.sampling.max_tokens;
  return static_cast<int32_t>(max_model_len - static_cast<int64_t>(request.prompt.size()));
}

}  // namespace beamline
