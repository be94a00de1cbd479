#pragma once
// The verification rule of one draft row (Leviathan et al. 2023, Chen et al. 2023): the target's distribution p at
// the draft's position is the one sample_row draws from (temperature -> min_p -> top_k -> top_p of the raw logits);
// the draft token d, proposed with probability q(d), is accepted with probability min(1, p(d) / q(d)), and a rejected
// row draws from the residual norm(max(0, p - q)) instead. The token that comes out is distributed as p exactly.
// Drafts here are point masses (q(d) = 1: the n-gram proposer), so acceptance is p(d) and the residual is p without d.
// Greedy rows need no rule: the target's argmax is accepted when it equals the draft and is the correction otherwise.
#include <cstdint>
#include <functional>
#include <span>

#include "sampling/sampling.h"

namespace beamline {

// One row: `row` holds the target's settings with row.uniform the acceptance draw; `residual_uniform` draws the
// replacement. Returns the draft token when accepted, else the residual draw (never the draft token), with the raw
// row's logprobs of whichever comes out when row.num_logprobs >= 0. `acceptance` (a test hook, normally empty)
// replaces p(d) as the acceptance probability.
SampledToken verify_draft_token(std::span<const float> raw, const SampleRow& row, int32_t draft_token,
                                double residual_uniform, const std::function<double(double)>& acceptance = {});

// The probability of `token` under `logits` after the row's transforms (its sampling distribution).
double target_probability(std::span<const float> raw, const SampleRow& row, int32_t token);

}  // namespace beamline
