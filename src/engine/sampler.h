#pragma once
// Turns one row of logits into the next token of one sample. The order follows vLLM's sampler:
//   raw logprobs (if asked) -> logit bias, min_tokens masking -> repetition, frequency, presence penalties
//   -> greedy argmax, or: temperature -> min_p -> top_k -> top_p -> draw from the softmax.
// The row transforms after the penalties are sampling/sampling.h's, run by the model runner (Backend::sample);
// this file holds what is per sample (its random stream, the tokens the penalties look at) and the host path of
// rows that need logit bias, penalties or masked tokens, which Backend::sample does not do: the engine hands it to
// the runner as RowSampling::sample_on_host (engine/model_runner.h).
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/logprobs_mode.h"
#include "engine/sampling_params.h"
#include "sampling/sampling.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

// What sampling remembers about one sample: its random stream (a counter-based generator keyed by the
// seed, so the k-th draw depends on nothing but the seed and k) and the tokens the penalties look at.
class SamplerState {
 public:
  SamplerState(uint64_t seed, std::span<const TokenId> prompt, const SamplingParams& params);

  double next_uniform();  // in [0, 1)
  // Takes back the last `count` draws (rows drawn for draft tokens that were not kept), so the next draw is the one
  // the sample would make without those rows.
  void take_back(uint64_t count) { draws_ -= count; }
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

// Does this step's row of the sample need the host path (logit bias, penalties, or `masked` tokens)?
bool needs_host_edits(const SamplingParams& params, std::span<const TokenId> masked);
// The Backend::sample settings of the sample's next token from logits row `logit_row`; draws the sample's
// uniform when it is not greedy (so a step consumes the same draws on either path).
SampleRow sample_settings(const SamplingParams& params, SamplerState& state, int32_t logit_row);

// The host path, whole: edits, then the same row sampling as Backend::sample, then record_output.
// `masked` are tokens that must not be chosen now (eos and stop ids before min_tokens). The logprobs, when asked,
// are of `mode`'s values (Backend::sample gives raw_logprobs only, so rows of other modes come here).
SampledToken sample_token(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                          std::span<const TokenId> masked, LogprobsMode mode = LogprobsMode::RawLogprobs);

// The logprobs entry of `token` in `mode` from the raw row and the row it was drawn from after the host edits
// (`edited`: bias, masks, penalties; temperature and the filters are applied here as the draw applied them).
TokenLogprob logprob_in_mode(std::span<const float> raw, std::span<const float> edited, const SampleRow& row,
                             int32_t token, LogprobsMode mode);

}  // namespace beamline
