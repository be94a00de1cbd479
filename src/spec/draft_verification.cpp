#include "spec/draft_verification.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace beamline {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// The row's logits after the same transforms as sample_row (NaN counts as -inf).
std::vector<float> transformed(std::span<const float> raw, const SampleRow& row) {
  std::vector<float> work(raw.begin(), raw.end());
  for (float& l : work) {
    if (std::isnan(l)) l = kNegativeInfinity;
  }
  apply_temperature(work, row.temperature);
  apply_min_p(work, row.min_p);
  apply_top_k(work, row.top_k);
  apply_top_p(work, row.top_p);
  return work;
}

double probability(std::span<const float> logits, int32_t token) {
  if (logits[token] == kNegativeInfinity) return 0.0;
  const float best = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float l : logits) total += l == kNegativeInfinity ? 0.0 : std::exp(static_cast<double>(l - best));
  return std::exp(static_cast<double>(logits[token] - best)) / total;
}

}  // namespace

double target_probability(std::span<const float> raw, const SampleRow& row, int32_t token) {
  return probability(transformed(raw, row), token);
}

SampledToken verify_draft_token(std::span<const float> raw, const SampleRow& row, int32_t draft_token,
                                double residual_uniform, const std::function<double(double)>& acceptance) {
  std::vector<float> work = transformed(raw, row);
  const double p = probability(work, draft_token);
  const double accept = acceptance ? acceptance(p) : p;
  // Nothing is left to draw when the draft holds all the mass (p = 1), so such a row always accepts.
  bool others_left = false;
  for (std::size_t t = 0; t < work.size() && !others_left; ++t)
    others_left = static_cast<int32_t>(t) != draft_token && work[t] != kNegativeInfinity;
  SampledToken result;
  if (row.uniform < accept || !others_left) {
    result.token = draft_token;
  } else {
    work[draft_token] = kNegativeInfinity;  // the residual max(0, p - q) of a point mass q, renormalised by the draw
    result.token = draw_token(work, residual_uniform);
  }
  if (row.num_logprobs >= 0) {
    std::vector<float> clean(raw.begin(), raw.end());
    for (float& l : clean) {
      if (std::isnan(l)) l = kNegativeInfinity;
    }
    result.logprob = token_logprob(clean, result.token, row.num_logprobs);
  }
  return result;
}

}  // namespace beamline
