#include "sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace beamline {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

float max_logit(std::span<const float> logits) {
  float best = kNegativeInfinity;
  for (float l : logits) best = std::max(best, l);
  return best;
}

// Is token a ranked before token b: higher logit, then lower id.
bool ranks_before(std::span<const float> logits, int32_t a, int32_t b) {
  return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

std::vector<float> without_nan(std::span<const float> logits) {
  std::vector<float> copy(logits.begin(), logits.end());
  for (float& l : copy) {
    if (std::isnan(l)) l = kNegativeInfinity;
  }
  return copy;
}

}  // namespace

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
  std::vector<int32_t> candidates;
  double total = 0;
  for (std::size_t t = 0; t < logits.size(); ++t) {
    if (logits[t] == kNegativeInfinity) continue;
    candidates.push_back(static_cast<int32_t>(t));
    total += std::exp(static_cast<double>(logits[t] - best));
  }
  auto by_rank = [&](int32_t a, int32_t b) { return ranks_before(logits, a, b); };
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

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t draw_token(std::span<const float> logits, double uniform) {
  const float best = max_logit(logits);
  double total = 0;
  for (float l : logits) total += l == kNegativeInfinity ? 0.0 : std::exp(static_cast<double>(l - best));
  const double target = uniform * total;
  double cumulative = 0;
  int32_t last = argmax(logits);
  for (std::size_t t = 0; t < logits.size(); ++t) {
    if (logits[t] == kNegativeInfinity) continue;
    cumulative += std::exp(static_cast<double>(logits[t] - best));
    last = static_cast<int32_t>(t);
    if (cumulative > target) return last;
  }
  return last;  // rounding left the target just above the sum
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t num_top) {
  const float best = max_logit(logits);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - best));
  const double log_total = static_cast<double>(best) + std::log(sum);
  auto logprob = [&](int32_t t) { return static_cast<float>(static_cast<double>(logits[t]) - log_total); };

  TokenLogprob result;
  result.token = token;
  result.logprob = logprob(token);
  result.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(), [&](float l) { return l > logits[token]; }));
  if (num_top > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto count = std::min<std::size_t>(num_top, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + count, ids.end(),
                      [&](int32_t a, int32_t b) { return ranks_before(logits, a, b); });
    for (std::size_t i = 0; i < count; ++i) result.top.emplace_back(ids[i], logprob(ids[i]));
  }
  return result;
}

SampledToken sample_row(std::span<const float> raw, std::span<const float> logits, const SampleRow& row) {
  SampledToken result;
  std::vector<float> work = without_nan(logits);
  if (row.greedy) {
    result.token = argmax(work);
  } else {
    apply_temperature(work, row.temperature);
    apply_min_p(work, row.min_p);
    apply_top_k(work, row.top_k);
    apply_top_p(work, row.top_p);
    result.token = draw_token(work, row.uniform);
  }
  if (row.num_logprobs >= 0) {
    const bool has_nan = std::any_of(raw.begin(), raw.end(), [](float l) { return std::isnan(l); });
    result.logprob = has_nan ? token_logprob(without_nan(raw), result.token, row.num_logprobs)
                             : token_logprob(raw, result.token, row.num_logprobs);
  }
  return result;
}

}  // namespace beamline
