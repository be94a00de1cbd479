#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/counter_random.h"

namespace beamline {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
constexpr float kMaxLogitBias = 100.0f;

bool has_penalties(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
}

}  // namespace

SamplerState::SamplerState(uint64_t seed, std::span<const TokenId> prompt, const SamplingParams& params) : seed_(seed) {
  if (params.repetition_penalty != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()), prompt_tokens_.end());
  }
}

double SamplerState::next_uniform() {
  const uint64_t bits = finalize64(seed_ ^ finalize64(++draws_ * 0x9e3779b97f4a7c15ULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

uint64_t sample_seed(const std::optional<uint64_t>& request_seed, int32_t index, uint64_t engine_draw) {
  return request_seed ? *request_seed + static_cast<uint64_t>(index) : engine_draw;
}

void apply_logit_bias(std::span<float> logits, const std::vector<std::pair<TokenId, float>>& bias) {
  for (const auto& [token, value] : bias) logits[token] += std::clamp(value, -kMaxLogitBias, kMaxLogitBias);
}

void mask_tokens(std::span<float> logits, std::span<const TokenId> tokens) {
  for (TokenId token : tokens) logits[token] = kNegativeInfinity;
}

void apply_penalties(std::span<float> logits, const SamplingParams& params, const SamplerState& state) {
  if (params.repetition_penalty != 1.0f) {
    const float r = params.repetition_penalty;
    auto penalize = [&](TokenId t) { logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r; };
    const auto& prompt = state.prompt_tokens();
    for (TokenId t : prompt) penalize(t);
    for (const auto& [t, count] : state.output_counts()) {
      if (!std::binary_search(prompt.begin(), prompt.end(), t)) penalize(t);
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [t, count] : state.output_counts()) {
      logits[t] -= params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
    }
  }
}

bool needs_host_edits(const SamplingParams& params, std::span<const TokenId> masked) {
  return !params.logit_bias.empty() || !masked.empty() || has_penalties(params);
}

SampleRow sample_settings(const SamplingParams& params, SamplerState& state, int32_t logit_row) {
  SampleRow row;
  row.logit_row = logit_row;
  row.greedy = params.greedy();
  row.temperature = params.temperature;
  row.min_p = params.min_p;
  row.top_k = params.top_k;
  row.top_p = params.top_p;
  if (!row.greedy) row.uniform = state.next_uniform();
  row.num_logprobs = params.logprobs.value_or(-1);
  return row;
}

TokenLogprob logprob_in_mode(std::span<const float> raw, std::span<const float> edited, const SampleRow& row,
                             int32_t token, LogprobsMode mode) {
  const bool processed = mode == LogprobsMode::ProcessedLogprobs || mode == LogprobsMode::ProcessedLogits;
  std::vector<float> values(processed ? edited.begin() : raw.begin(), processed ? edited.end() : raw.end());
  for (float& v : values) {
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  }
  if (processed && !row.greedy) {
    apply_temperature(values, row.temperature);
    apply_min_p(values, row.min_p);
    apply_top_k(values, row.top_k);
    apply_top_p(values, row.top_p);
  }
  // Ranks and the best alternatives are the same whether read as logits or as their log-softmax.
  TokenLogprob result = token_logprob(values, token, row.num_logprobs);
  if (mode == LogprobsMode::RawLogits || mode == LogprobsMode::ProcessedLogits) {
    result.logprob = values[static_cast<std::size_t>(token)];
    for (auto& [id, value] : result.top) value = values[static_cast<std::size_t>(id)];
  }
  return result;
}

SampledToken sample_token(std::span<const float> raw_logits, const SamplingParams& params, SamplerState& state,
                          std::span<const TokenId> masked, LogprobsMode mode) {
  std::vector<float> logits(raw_logits.begin(), raw_logits.end());
  apply_logit_bias(logits, params.logit_bias);
  mask_tokens(logits, masked);
  apply_penalties(logits, params, state);
  const SampleRow row = sample_settings(params, state, 0);
  SampledToken result = sample_row(raw_logits, logits, row);
  if (result.logprob && mode != LogprobsMode::RawLogprobs)
    result.logprob = logprob_in_mode(raw_logits, logits, row, result.token, mode);
  state.record_output(result.token);
  return result;
}

}  // namespace beamline
