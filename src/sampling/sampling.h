#pragma once
// The row transforms of sampling in vLLM's order (temperature -> min_p -> top_k -> top_p -> inverse-CDF draw,
// or greedy argmax) and the log-probabilities of the raw logits: the one host implementation, used by the CPU
// backend's Backend::sample and by the engine's host path (engine/sampler.h) for rows that need logit bias,
// penalties or masked tokens first. Its own library below both the backend and the engine, so that the engine
// describes its rows (SampleRow) and reads its tokens (SampledToken) without a backend header. Each transform is
// a free function over a row so tests can check it against a naive version. Token ids are int32_t
// (tokenizer/tokenizer.h's TokenId).
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace beamline {

// What one row of Backend::sample asks for.
struct SampleRow {
  int32_t logit_row = 0;      // the row of the logits tensor to sample
  bool greedy = false;        // argmax (ties: the lower id); temperature, the filters and `uniform` are unused
  float temperature = 1.0f;   // > 0: the logits are divided by it
  float min_p = 0.0f;         // in [0, 1]: drop tokens whose probability is below min_p * the top probability
  int32_t top_k = 0;          // <= 0 or >= V: off; else keep the tokens at least as likely as the k-th
  float top_p = 1.0f;         // in (0, 1]: keep the smallest most-likely set (ties by lower id) with mass >= top_p
  double uniform = 0.0;       // in [0, 1): the draw, inverse CDF over the kept tokens in token-id order
  int32_t num_logprobs = -1;  // -1: none; n >= 0: the sampled token's logprob and rank and the n most likely
};

// Log-softmax of the raw logits at one token, its rank (1 = the most likely) and the best alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t rank = 1;
  std::vector<std::pair<int32_t, float>> top;  // the `num_logprobs` most likely tokens, best first (ties: lower id)
};

struct SampledToken {
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;  // when the row asked (num_logprobs >= 0)
};

void apply_temperature(std::span<float> logits, float temperature);
void apply_min_p(std::span<float> logits, float min_p);
void apply_top_k(std::span<float> logits, int32_t top_k);  // keeps every token tied with the k-th
void apply_top_p(std::span<float> logits, float top_p);    // smallest most-likely set (ties by lower id) with mass >= top_p
int32_t argmax(std::span<const float> logits);             // ties: the lower id
// Inverse-CDF draw from softmax(logits) in token-id order with `uniform` in [0, 1).
int32_t draw_token(std::span<const float> logits, double uniform);
// Log-softmax of `logits` at `token`, its rank, and the `num_top` best tokens.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t num_top);

// One row as Backend::sample defines it: the token is chosen from `logits` (the raw row, or the host path's
// edited copy), the logprobs come from `raw`. NaN logits count as -inf; a row with no finite logit gives 0.
SampledToken sample_row(std::span<const float> raw, std::span<const float> logits, const SampleRow& row);

}  // namespace beamline
