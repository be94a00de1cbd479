#pragma once
// What the GPU benchmark commands share: the roofs every figure is reported against (PERF.md), the median of
// timed samples, random MoE layers drawn on the device, and CUDA status checks that name the command.
#include <algorithm>
#include <string_view>
#include <vector>

#ifdef BEAMLINE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "model/config.h"
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
// One MoE layer of `config` drawn on the device (fan-in scaled BF16 experts, F32 router), prepared for the moe op.
// The router's spread decides how peaked the routing is: near zero routes close to uniformly over the experts.
inline MoeTensors random_moe_layer(CudaBackend& backend, const ModelConfig& config, uint64_t& seed,
                                   float router_stddev, float bias_stddev) {
  const int64_t hidden = config.hidden_size, intermediate = config.moe_intermediate_size;
  auto weight = [&](std::vector<int64_t> shape, float stddev, DType dtype = DType::BF16) {
    return backend.random_weight(dtype, std::move(shape), seed++, 0.0f, stddev);
  };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  const float down_scale = 1.0f / std::sqrt(static_cast<float>(intermediate));
  MoeTensors moe;
  moe.router = weight({config.n_routed_experts, hidden}, router_stddev, DType::F32);
  moe.router_bias = weight({config.n_routed_experts}, bias_stddev, DType::F32);
  for (int64_t e = 0; e < config.n_routed_experts; ++e)
    moe.experts.push_back({{weight({intermediate, hidden}, in_scale), {}, {}},
                           {weight({intermediate, hidden}, in_scale), {}, {}},
                           {weight({hidden, intermediate}, down_scale), {}, {}}});
  backend.prepare_moe(moe);
  return moe;
}

inline void check_cuda(cudaError_t status, std::string_view command, std::string_view what) {
  require(status == cudaSuccess, "{}: {} failed: {}", command, what, cudaGetErrorString(status));
}
#endif

}  // namespace beamline::cli
