#pragma once
// Gathered LoRA (Backend::lora, punica's BGMV): each row's adapter read by index, in two launches (lora.cu).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace beamline::cuda {

// y[t] += b[i] (a[i] x[t]) for i = indices[t] in [0, adapters); rows with a negative index are left as they are, rows
// with an index >= adapters get NaN (the host cannot see device indices to refuse them). a [adapters, rank, in],
// b [adapters, out, rank], x [rows, in], y [rows, out], all F32; `shrunk` is F32 scratch [rows, rank]. Shrink: one
// block per row, a warp per rank row of a (float4 loads where `in` allows). Expand: a thread per output, the row's
// rank-R intermediate from shared memory.
cudaError_t lora_gathered(const float* x, const float* a, const float* b, const int32_t* indices, int64_t rows,
                          int64_t adapters, int64_t rank, int64_t in, int64_t out, float* shrunk, float* y,
                          cudaStream_t stream);

}  // namespace beamline::cuda
