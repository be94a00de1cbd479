#pragma once
#include <cstdint>
#include <vector>

namespace beamline {

// A proposed draft: its tokens and, per token, the drafter's probability of it (its softmax at that block row: the
// confidence adaptive verification calibrates, spec/adaptive_verification.h), or no confidences (n-gram lookup).
struct DraftProposal {
  std::vector<int32_t> tokens;
  std::vector<float> confidence;
};

}  // namespace beamline
