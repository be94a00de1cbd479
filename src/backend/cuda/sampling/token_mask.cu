#include "backend/cuda/sampling/token_mask.h"

#include <cuda/std/limits>

namespace beamline::cuda {
namespace {

// One thread per mask word (32 tokens): the bitmask is read once, coalesced, and most words of a grammar's mask are
// all ones or all zeros, so a thread touches its 32 logits only where a bit is clear.
__global__ void mask_logits_kernel(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* allowed,
                                   int64_t words) {
  const int64_t word = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t used_words = (vocab + 31) / 32;
  if (word >= used_words) return;
  const uint32_t bits = allowed[int64_t{blockIdx.y} * words + word];
  if (bits == 0xFFFFFFFFu) return;
  float* row = logits + int64_t{rows[blockIdx.y]} * vocab;
  const int64_t first = word * 32;
  const int64_t last = first + 32 < vocab ? first + 32 : vocab;
  for (int64_t t = first; t < last; ++t)
    if (((bits >> (t - first)) & 1u) == 0) row[t] = -::cuda::std::numeric_limits<float>::infinity();
}

}  // namespace

cudaError_t mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* allowed, int64_t words,
                        int32_t count, cudaStream_t stream) {
  if (count == 0 || vocab == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t used_words = (vocab + 31) / 32;
  const dim3 grid(static_cast<unsigned int>((used_words + kThreads - 1) / kThreads), static_cast<unsigned int>(count));
  mask_logits_kernel<<<grid, kThreads, 0, stream>>>(logits, vocab, rows, allowed, words);
  return cudaGetLastError();
}

}  // namespace beamline::cuda
