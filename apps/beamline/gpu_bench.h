#pragma once
// What the GPU benchmark commands share: the roofs every figure is reported against (PERF.md), the median of
// timed samples, and CUDA status checks that name the command.
#include <algorithm>
#include <string_view>
#include <vector>

#ifdef BEAMLINE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "util/error.h"

namespace beamline::cli {

constexpr double kHbmBytesPerSecond = 4.8e12;   // the floor of memory-bound work: bytes / this
constexpr double kBf16FlopsPerSecond = 758e12;  // the floor of compute-bound work: FLOPs / this

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

#ifdef BEAMLINE_HAVE_CUDA
inline void check_cuda(cudaError_t status, std::string_view command, std::string_view what) {
  require(status == cudaSuccess, "{}: {} failed: {}", command, what, cudaGetErrorString(status));
}
#endif

}  // namespace beamline::cli
