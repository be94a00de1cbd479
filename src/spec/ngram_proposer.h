#pragma once
// The n-gram (prompt lookup) proposer: a draft copied from the sequence's own context, no drafter model.
#include <cstdint>
#include <span>
#include <vector>

namespace beamline {

// Finds the longest suffix of `context` of min_n..max_n tokens that also occurs earlier in it (the latest such
// occurrence) and proposes the up to `k` tokens that followed that occurrence. The copy may run into the tokens it
// has just proposed (as an LZ77 copy does), so a repetition whose period is shorter than k still gives k tokens.
// Empty when no suffix of at least min_n tokens recurs.
std::vector<int32_t> propose_ngram_draft(std::span<const int32_t> context, int32_t min_n, int32_t max_n, int32_t k);

}  // namespace beamline
