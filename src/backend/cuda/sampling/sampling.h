#pragma once
// Backend::sample on the device (sampling.cu).
// Conventions: backend/cuda/common/operand_precision.h.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/common/operand_precision.h"
#include "tensor/dtype.h"

namespace beamline::cuda {

// One row of Backend::sample as the kernel reads it (uploaded per call).
struct SampleRowParams {
  double uniform = 0.0;
  int32_t logit_row = 0, greedy = 0, top_k = 0, num_logprobs = -1;
  float temperature = 1.0f, min_p = 0.0f, top_p = 1.0f, unused = 0.0f;
};
// Backend::sample over `count` rows of logits [*, vocab], vocab at most 1398016: one block per row, a second kernel for
// the logprobs (sampling/sampling.cu). The logprob outputs may be null when no row has num_logprobs >= 0; top_* are
// [count, top_width]. Each row's blocks (a cluster that splits its vocabulary) are as many as fit the GPU for `count`
// rows; `row_invariant` (--batch-invariant) fixes them by the vocabulary alone, so that a row's sums (the softmax's
// normaliser, the draw's masses) do not depend on how many rows share the call.
cudaError_t sample(const float* logits, int64_t vocab, const SampleRowParams* rows, int32_t count, int32_t* tokens,
                   float* logprobs, int32_t* ranks, int32_t* top_ids, float* top_logprobs, int32_t top_width,
                   cudaStream_t stream, bool row_invariant = false);

}  // namespace beamline::cuda
