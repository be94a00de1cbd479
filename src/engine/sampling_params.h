#pragma once
// Per-request sampling options (the OpenAI / vLLM fields) and their validation.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace beamline {

// Below this temperature sampling is greedy (argmax after logit bias and penalties).
inline constexpr float kGreedyTemperature = 1e-5f;

struct SamplingParams {
  int32_t n = 1;                         // parallel samples sharing the prompt
  float temperature = 1.0f;
  float top_p = 1.0f;                    // nucleus: smallest set with probability >= top_p
  int32_t top_k = 0;                     // 0 or -1: off
  float min_p = 0.0f;                    // drop tokens below min_p * the top probability
  float presence_penalty = 0.0f;         // over generated tokens
  float frequency_penalty = 0.0f;        // over generated tokens
  float repetition_penalty = 1.0f;       // over prompt and generated tokens (CTRL-style)
  std::vector<std::pair<TokenId, float>> logit_bias;  // added to the logits (clamped to [-100, 100])
  std::optional<uint64_t> seed;          // same seed + same request = same output, whatever the batch
  std::optional<int32_t> max_tokens;     // default: up to the context length
  int32_t min_tokens = 0;                // eos and stop token ids are masked until this many tokens
  std::vector<std::string> stop;         // stop strings (matched across token boundaries; needs detokenize)
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;       // special tokens add no text (their ids are still returned)
  std::optional<int32_t> logprobs;       // log-probabilities of sampled tokens plus this many alternatives
  std::optional<int32_t> prompt_logprobs;  // vLLM's: each prompt token's (after the first) plus this many alternatives

  bool greedy() const { return temperature < kGreedyTemperature; }
};

// Throws InvalidRequest (request.h) naming the field of the first bad value.
void validate_sampling_params(const SamplingParams& params, int32_t vocab_size, int32_t max_logprobs);

}  // namespace beamline
