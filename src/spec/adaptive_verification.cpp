#include "spec/adaptive_verification.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <utility>

#include "util/error.h"

namespace beamline {
namespace {

// Counts decay by this factor at each new observation of their rate: a half-life of ~700 observations.
constexpr double kDecay = 0.999;
// Prior weights, in observations: a confidence bin starts at the confidence itself, a position at one half.
constexpr double kConfidencePrior = 4.0, kPositionPrior = 2.0;
// Moving-average weight of a new step time.
constexpr double kCostWeight = 0.25;

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace

AdaptiveVerification::AdaptiveVerification(int32_t max_draft_tokens, bool uniform)
    : max_draft_tokens_(max_draft_tokens),
      uniform_(uniform),
      by_position_(static_cast<std::size_t>(max_draft_tokens)),
      by_confidence_(kConfidenceBins) {
  require(max_draft_tokens >= 1, "adaptive verification: {} draft tokens", max_draft_tokens);
}

int32_t AdaptiveVerification::bucket_index(int32_t decoding) {
  return static_cast<int32_t>(std::bit_width(static_cast<uint32_t>(std::max(decoding, 1) - 1)));
}

AdaptiveVerification::Bucket& AdaptiveVerification::bucket(int32_t decoding, bool prompt_rows) {
  std::vector<Bucket>& buckets = buckets_[prompt_rows ? 1 : 0];
  const auto index = static_cast<std::size_t>(bucket_index(decoding));
  while (buckets.size() <= index) {
    Bucket fresh;
    fresh.cost.resize(static_cast<std::size_t>(max_draft_tokens_) + 1);
    buckets.push_back(std::move(fresh));
  }
  return buckets[index];
}

const AdaptiveVerification::Bucket* AdaptiveVerification::find_bucket(int32_t decoding, bool prompt_rows) const {
  const std::vector<Bucket>& buckets = buckets_[prompt_rows ? 1 : 0];
  const auto index = static_cast<std::size_t>(bucket_index(decoding));
  return index < buckets.size() ? &buckets[index] : nullptr;
}

double AdaptiveVerification::acceptance(int32_t position, std::optional<float> confidence) const {
  if (confidence) {
    const double c = std::clamp(static_cast<double>(*confidence), 0.01, 0.99);
    const Rate& rate = by_confidence_[static_cast<std::size_t>(std::min(kConfidenceBins - 1,
                                                                        static_cast<int32_t>(c * kConfidenceBins)))];
    return (rate.accepted + kConfidencePrior * c) / (rate.reached + kConfidencePrior);
  }
  const Rate& rate = by_position_[static_cast<std::size_t>(std::clamp(position, 0, max_draft_tokens_ - 1))];
  return (rate.accepted + kPositionPrior * 0.5) / (rate.reached + kPositionPrior);
}

std::optional<double> AdaptiveVerification::estimate(const Bucket& bucket, int32_t per_sequence) const {
  const auto& cost = bucket.cost;
  if (known(cost[static_cast<std::size_t>(per_sequence)])) return cost[static_cast<std::size_t>(per_sequence)].seconds;
  std::optional<int32_t> lower, upper;
  for (int32_t k = per_sequence - 1; k >= 0 && !lower; --k)
    if (known(cost[static_cast<std::size_t>(k)])) lower = k;
  for (int32_t k = per_sequence + 1; k <= max_draft_tokens_ && !upper; ++k)
    if (known(cost[static_cast<std::size_t>(k)])) upper = k;
  if (lower && upper) {
    const double low = cost[static_cast<std::size_t>(*lower)].seconds, high = cost[static_cast<std::size_t>(*upper)].seconds;
    return low + (high - low) * (per_sequence - *lower) / (*upper - *lower);
  }
  if (lower) return cost[static_cast<std::size_t>(*lower)].seconds;
  if (upper) return cost[static_cast<std::size_t>(*upper)].seconds;
  return std::nullopt;
}

std::optional<double> AdaptiveVerification::step_seconds(int32_t decoding, int32_t drafts_per_sequence,
                                                         bool prompt_rows) const {
  const Bucket* found = find_bucket(decoding, prompt_rows);
  if (found == nullptr) return std::nullopt;
  return estimate(*found, std::clamp(drafts_per_sequence, 0, max_draft_tokens_));
}

std::vector<double> AdaptiveVerification::gains(std::span<const Candidate> candidates,
                                                std::vector<std::vector<double>>* per_candidate) const {
  std::vector<double> all;
  for (const Candidate& candidate : candidates) {
    std::vector<double> own;
    const std::size_t limit = candidate.confidence.empty()
                                  ? static_cast<std::size_t>(std::min(candidate.room, max_draft_tokens_))
                                  : std::min(static_cast<std::size_t>(std::max(candidate.room, 0)), candidate.confidence.size());
    double reach = 1.0;  // the chance that every draft before this one is accepted
    for (std::size_t j = 0; j < limit; ++j) {
      const std::optional<float> confidence =
          candidate.confidence.empty() ? std::nullopt : std::optional<float>(candidate.confidence[j]);
      reach *= acceptance(static_cast<int32_t>(j), confidence);
      own.push_back(reach);
    }
    all.insert(all.end(), own.begin(), own.end());
    if (per_candidate != nullptr) per_candidate->push_back(std::move(own));
  }
  std::sort(all.begin(), all.end(), std::greater<>());
  return all;
}

std::optional<std::pair<int32_t, double>> AdaptiveVerification::best(const Bucket& bucket, int32_t decoding,
                                                                     std::span<const double> gains,
                                                                     int32_t min_n) const {
  std::optional<std::pair<int32_t, double>> result;
  double tokens = decoding, full_rate = 0;
  const auto full = static_cast<int32_t>(gains.size());
  for (int32_t n = 0; n <= full; ++n) {
    if (n > 0) tokens += gains[static_cast<std::size_t>(n - 1)];
    if (n < min_n) continue;
    const std::optional<double> seconds = estimate(bucket, std::min(max_draft_tokens_, ceil_div(n, decoding)));
    if (!seconds) return std::nullopt;
    const double rate = tokens / std::max(*seconds, 1e-9);
    if (n == full) full_rate = rate;
    if (!result || rate > result->second) result = std::make_pair(n, rate);
  }
  if (result && result->second < full_rate * (1 + kFullDraftMargin)) result = std::make_pair(full, full_rate);
  return result;
}

std::optional<std::pair<int32_t, double>> AdaptiveVerification::best_uniform(
    const Bucket& bucket, int32_t decoding, const std::vector<std::vector<double>>& per_candidate, int32_t min_k) const {
  std::optional<std::pair<int32_t, double>> result;
  double tokens = decoding, full_rate = 0;
  for (int32_t k = 0; k <= max_draft_tokens_; ++k) {
    if (k > 0)
      for (const std::vector<double>& own : per_candidate)
        if (static_cast<std::size_t>(k) <= own.size()) tokens += own[static_cast<std::size_t>(k - 1)];
    if (k < min_k) continue;
    const std::optional<double> seconds = estimate(bucket, k);
    if (!seconds) return std::nullopt;
    const double rate = tokens / std::max(*seconds, 1e-9);
    if (k == max_draft_tokens_) full_rate = rate;
    if (!result || rate > result->second) result = std::make_pair(k, rate);
  }
  if (result && result->second < full_rate * (1 + kFullDraftMargin)) result = std::make_pair(max_draft_tokens_, full_rate);
  return result;
}

bool AdaptiveVerification::should_draft(int32_t decoding, std::span<const Candidate> candidates, bool prompt_rows) {
  if (candidates.empty()) return false;
  decoding = std::max(decoding, static_cast<int32_t>(candidates.size()));
  Bucket& b = bucket(decoding, prompt_rows);
  ++b.steps;
  const bool drafted_known = std::any_of(b.cost.begin() + 1, b.cost.end(), known);
  bool draft = true;
  if (!drafted_known) {
    draft = true;  // exploring: measure drafted steps first (the fixed-K behaviour)
  } else if (!known(b.cost[0])) {
    draft = false;  // then plain ones
  } else {
    std::vector<std::vector<double>> own;
    const std::vector<double> g = gains(candidates, &own);
    const std::optional<std::pair<int32_t, double>> choice =
        uniform_ && !prompt_rows ? best_uniform(b, decoding, own, 0) : best(b, decoding, g, 0);
    draft = choice && choice->first > 0;
    if (draft != b.last_drafted) b.interval = kFirstExploreInterval;  // the choice flipped: watch the other kind again
    b.last_drafted = draft;
    // The losing kind is measured again now and then, less often each time it still loses.
    const int64_t since = b.steps - (draft ? b.plain_measured_at : b.drafted_measured_at);
    if (since >= b.interval) {
      draft = !draft;
      b.interval = std::min<int64_t>(2 * b.interval, kMaxExploreInterval);
    }
  }
  (draft ? b.drafted_measured_at : b.plain_measured_at) = b.steps;
  return draft;
}

std::vector<int32_t> AdaptiveVerification::choose(int32_t decoding, std::span<const Candidate> candidates,
                                                  bool drafted, bool prompt_rows) {
  std::vector<std::vector<double>> own;
  const std::vector<double> sorted = gains(candidates, &own);
  std::vector<int32_t> counts(candidates.size(), 0);
  if (sorted.empty()) return counts;
  decoding = std::max(decoding, static_cast<int32_t>(candidates.size()));
  const Bucket& b = bucket(decoding, prompt_rows);
  const bool measured = std::any_of(b.cost.begin() + 1, b.cost.end(), known);
  if (uniform_ && !prompt_rows) {
    int32_t k = max_draft_tokens_;  // nothing drafted measured yet: verify everything
    if (measured) {
      if (const std::optional<std::pair<int32_t, double>> choice = best_uniform(b, decoding, own, drafted ? 1 : 0))
        k = choice->first;
    }
    for (std::size_t i = 0; i < own.size(); ++i) counts[i] = std::min(k, static_cast<int32_t>(own[i].size()));
    return counts;
  }
  int32_t n = static_cast<int32_t>(sorted.size());  // nothing drafted measured yet: verify everything
  if (measured) {
    if (const std::optional<std::pair<int32_t, double>> choice = best(b, decoding, sorted, drafted ? 1 : 0))
      n = choice->first;
  }
  if (n == 0) return counts;
  // The n largest gains: a prefix of each candidate's (non-increasing) gains, taken down to the n-th value; of the
  // gains equal to it, the earlier candidates' first.
  const double threshold = sorted[static_cast<std::size_t>(n - 1)];
  int32_t at_threshold = static_cast<int32_t>(std::count(sorted.begin(), sorted.begin() + n, threshold));
  for (std::size_t i = 0; i < own.size(); ++i) {
    for (const double gain : own[i]) {
      if (gain > threshold) {
        ++counts[i];
      } else if (gain == threshold && at_threshold > 0) {
        ++counts[i];
        --at_threshold;
      } else {
        break;
      }
    }
  }
  return counts;
}

void AdaptiveVerification::decay_and_add(Rate& rate, bool accepted) {
  rate.accepted = rate.accepted * kDecay + (accepted ? 1.0 : 0.0);
  rate.reached = rate.reached * kDecay + 1.0;
}

void AdaptiveVerification::record_verification(std::span<const float> confidence, int32_t verified, int32_t accepted) {
  // Drafts 0..accepted were reached (every one before them accepted); the one at `accepted` was rejected.
  for (int32_t j = 0; j < verified && j <= accepted; ++j) {
    const bool ok = j < accepted;
    decay_and_add(by_position_[static_cast<std::size_t>(std::min(j, max_draft_tokens_ - 1))], ok);
    if (static_cast<std::size_t>(j) < confidence.size()) {
      const double c = std::clamp(static_cast<double>(confidence[static_cast<std::size_t>(j)]), 0.0, 0.999999);
      decay_and_add(by_confidence_[static_cast<std::size_t>(c * kConfidenceBins)], ok);
    }
  }
}

void AdaptiveVerification::record_step(int32_t decoding, int32_t draft_tokens, bool drafter_ran, double seconds,
                                       bool prompt_rows) {
  if (decoding < 1 || (drafter_ran && draft_tokens == 0)) return;
  const int32_t per_sequence = std::min(max_draft_tokens_, ceil_div(draft_tokens, decoding));
  Cost& cost = bucket(decoding, prompt_rows).cost[static_cast<std::size_t>(per_sequence)];
  if (cost.samples <= 1) {
    cost.seconds = seconds;  // the first sample (a warm-up: graph recording, first-touch) is replaced by the second
  } else {
    cost.seconds += kCostWeight * (std::min(seconds, 2 * cost.seconds) - cost.seconds);
  }
  ++cost.samples;
}

}  // namespace beamline
