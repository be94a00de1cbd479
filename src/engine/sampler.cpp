#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace beamline {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
constexpr float kMaxLogitBias = 100.0f;

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

float max_logit(std::span<const float> logits) {
  float best = kNegativeInfinity;
  for (float l : logits) best = std::max(best, l);
  return best;
}

// Is token a ranked before token b: higher logit, then lower id.
bool ranks_before(std::span<const float> logits, TokenId a, TokenId b) {
  return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
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
  const uint64_t bits = mix(seed_ ^ mix(++draws_ * 0x9e3779b97f4a7c15ULL));
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

void apply_temperature(std::span<float> logits, float temperature) {
  if (temperature == 1.0f) return;
  for (float& l : logits) l /= temperature;
}

void apply_min_p(std::span<float> logits, float min_p) {
  if (min_p <= 0.0f) return;
  // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
  const float threshold = max_logit(logits) + std::log(min_p);
  for (float& l : logits) {
    if (l < threshold) l = kNegativeInfinity;
  }
}

void apply_top_k(std::span<float> logits, int32_t top_k) {
  if (top_k <= 0 || static_cast<std::size_t>(top_k) >= logits.size()) return;
  std::vector<float> values(logits.begin(), logits.end());
  std::nth_element(values.begin(), values.begin() + (top_k - 1), values.end(), std::greater<>());
  const float kth = values[top_k - 1];
  for (float& l : logits) {
    if (l < kth) l = kNegativeInfinity;
  }
}

void apply_top_p(std::span<float> logits, float top_p) {
  if (top_p >= 1.0f) return;
  const float best = max_logit(logits);
  if (best == kNegativeInfinity) return;
  std::vector<TokenId> candidates;
  double total = 0;
  for (std::size_t t = 0; t < logits.size(); ++t) {
    if (logits[t] == kNegativeInfinity) continue;
    candidates.push_back(static_cast<TokenId>(t));
    total += std::exp(static_cast<double>(logits[t] - best));
  }
  auto by_rank = [&](TokenId a, TokenId b) { return ranks_before(logits, a, b); };
  const double target = static_cast<double>(top_p) * total;
  // Rank only as many of the best tokens as the nucleus needs: a few hundred usually cover it.
  for (std::size_t prefix = std::min<std::size_t>(256, candidates.size());; prefix = std::min(prefix * 4, candidates.size())) {
    std::partial_sort(candidates.begin(), candidates.begin() + prefix, candidates.end(), by_rank);
    double cumulative = 0;
    std::size_t kept = 0;
    while (kept < prefix && cumulative < target) {
      cumulative += std::exp(static_cast<double>(logits[candidates[kept]] - best));
      ++kept;
    }
    if (cumulative >= target || prefix == candidates.size()) {
      for (std::size_t i = kept; i < candidates.size(); ++i) logits[candidates[i]] = kNegativeInfinity;
      return;
    }
  }
}

TokenId argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TokenId draw_token(std::span<const float> logits, double uniform) {
  const float best = max_logit(logits);
  double total = 0;
  for (float l : logits) total += l == kNegativeInfinity ? 0.0 : std::exp(static_cast<double>(l - best));
  const double target = uniform * total;
  double cumulative = 0;
  TokenId last = argmax(logits);
  for (std::size_t t = 0; t < logits.size(); ++t) {
    if (logits[t] == kNegativeInfinity) continue;
    cumulative += std::exp(static_cast<double>(logits[t] - best));
    last = static_cast<TokenId>(t);
    if (cumulative > target) return last;
  }
  return last;  // rounding left the target just above the sum
}

TokenLogprob token_logprob(std::span<const float> logits, TokenId token, int32_t num_top) {
  const float best = max_logit(logits);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - best));
  const double log_total = static_cast<double>(best) + std::log(sum);
  auto logprob = [&](TokenId t) { return static_cast<float>(static_cast<double>(logits[t]) - log_total); };

  TokenLogprob result;
  result.token = token;
  result.logprob = logprob(token);
  result.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(), [&](float l) { return l > logits[token]; }));
  if (num_top > 0) {
    std::vector<TokenId> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto count = std::min<std::size_t>(num_top, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + count, ids.end(),
                      [&](TokenId a, TokenId b) { return ranks_before(logits, a, b); });
    for (std::size_t i = 0; i < count; ++i) result.top.emplace_back(ids[i], logprob(ids[i]));
  }
  return result;
}

SampledToken sample_token(std::span<const float> raw_logits, const SamplingParams& params, SamplerState& state,
                          std::span<const TokenId> masked) {
  SampledToken result;
  std::vector<float> logits(raw_logits.begin(), raw_logits.end());
  apply_logit_bias(logits, params.logit_bias);
  mask_tokens(logits, masked);
  apply_penalties(logits, params, state);
  if (params.greedy()) {
    result.token = argmax(logits);
  } else {
    apply_temperature(logits, params.temperature);
    apply_min_p(logits, params.min_p);
    apply_top_k(logits, params.top_k);
    apply_top_p(logits, params.top_p);
    result.token = draw_token(logits, state.next_uniform());
  }
  if (params.logprobs) result.logprob = token_logprob(raw_logits, result.token, *params.logprobs);
  state.record_output(result.token);
  return result;
}

}  // namespace beamline
