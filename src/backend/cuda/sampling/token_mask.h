#pragma once
// Backend::mask_logits on the device (token_mask.cu): structured outputs' allowed-token bitmasks, applied to the
// logits before Backend::sample.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace beamline::cuda {

// For each mask i < count: logits[rows[i] * vocab + t] = -inf where bit t % 32 of allowed[i * words + t / 32] is 0.
cudaError_t mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* allowed, int64_t words,
                        int32_t count, cudaStream_t stream);

}  // namespace beamline::cuda
