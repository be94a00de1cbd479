#include "spec/ngram_proposer.h"

namespace beamline {

std::vector<int32_t> propose_ngram_draft(std::span<const int32_t> context, int32_t min_n, int32_t max_n, int32_t k) {
  const auto length = static_cast<int64_t>(context.size());
  if (k <= 0 || min_n <= 0 || length < int64_t{min_n} + 1) return {};
  // One backward scan: at each earlier end position, the length of the match with the context's suffix (capped at
  // max_n). The latest end with the longest match wins; a match of max_n tokens cannot be beaten, so it stops there.
  int64_t best_end = -1;
  int32_t best_length = 0;
  for (int64_t end = length - 2; end >= 0 && best_length < max_n; --end) {
    int32_t match = 0;
    while (match < max_n && end - match >= 0 && context[end - match] == context[length - 1 - match]) ++match;
    if (match > best_length) {
      best_length = match;
      best_end = end;
    }
  }
  if (best_length < min_n) return {};
  std::vector<int32_t> draft;
  draft.reserve(static_cast<std::size_t>(k));
  for (int64_t from = best_end + 1; static_cast<int32_t>(draft.size()) < k; ++from) {
    draft.push_back(from < length ? context[from] : draft[static_cast<std::size_t>(from - length)]);
  }
  return draft;
}

}  // namespace beamline
