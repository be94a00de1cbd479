#pragma once
// Turns one row of logits into the next token of one sample. The order follows vLLM's sampler:
//   raw logprobs (if asked) -> logit bias, min_tokens masking -> repetition, frequency, presence penalties
//   -> greedy argmax, or: temperature -> min_p -> top_k -> top_p -> draw from the softmax.
// Each transform is a free function over a row so tests can check it against a naive version.
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/request_output.h"
#include "engine/sampling_params.h"
#include "text/tokenizer.h"

namespace beamline {

// What sampling remembers about one sample: its random stream (a counter-based generator keyed by the
// seed, so the k-th draw depends on nothing but the seed and k) and the tokens the penalties look at.
class SamplerState {
 public:
  SamplerState(uint64_t seed, std::span<const TokenId> prompt, const SamplingParams& params);

  double next_uniform();  // in [0, 1)
  void record_output(TokenId token) { ++output_counts_[token]; }
  const std::unordered_map<TokenId, int32_t>& output_counts() const { return output_counts_; }
  const std::vector<TokenId>& prompt_tokens() const { return prompt_tokens_; }  // sorted, unique

 private:
  uint64_t seed_;
  uint64_t draws_ = 0;
  std::unordered_map<TokenId, int32_t> output_counts_;
  std::vector<TokenId> prompt_tokens_;  // only kept when a repetition penalty applies
};

// The seed of sample `index` of a request: its own seed (plus the index, so parallel samples differ) or
// one drawn from the engine's generator.
uint64_t sample_seed(const std::optional<uint64_t>& request_seed, int32_t index, uint64_t engine_draw);

void apply_logit_bias(std::span<float> logits, const std::vector<std::pair<TokenId, float>>& bias);
void mask_tokens(std::span<float> logits, std::span<const TokenId> tokens);  // to -inf
void apply_penalties(std::span<float> logits, const SamplingParams& params, const SamplerState& state);
void apply_temperature(std::span<float> logits, float temperature);
void apply_min_p(std::span<float> logits, float min_p);
void apply_top_k(std::span<float> logits, int32_t top_k);  // keeps every token tied with the k-th
void apply_top_p(std::span<float> logits, float top_p);    // smallest most-likely set (ties by lower id) with mass >= top_p
TokenId argmax(std::span<const float> logits);             // ties: the lower id
// Inverse-CDF draw from softmax(logits) in token-id order with `uniform` in [0, 1).
TokenId draw_token(std::span<const float> logits, double uniform);
// Log-softmax of `logits` at `token`, its rank, and the `num_top` best tokens.
TokenLogprob token_logprob(std::span<const float> logits, TokenId token, int32_t num_top);

struct SampledToken {
  TokenId token = 0;
  std::optional<TokenLogprob> logprob;  // when params.logprobs is set
};

// `masked` are tokens that must not be chosen now (eos and stop ids before min_tokens).
SampledToken sample_token(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                          std::span<const TokenId> masked);

}  // namespace beamline
