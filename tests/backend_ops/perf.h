#pragma once
// Perf mode of backend_ops: what the timed families share. The roofs every figure is reported against (PERF.md),
// the median of timed samples, CUDA-graph timing, random MoE layers drawn on the device, and CUDA status checks
// that name the family. Timing needs the CUDA backend: in a build without it, perf mode says so and exits 1.
#include <algorithm>
#include <string_view>
#include <vector>

#include "util/error.h"

#ifdef BEAMLINE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <functional>

#include "backend/cuda/cuda_backend.h"
#include "model/config.h"
#endif

namespace beamline::backend_ops {

constexpr double kHbmBytesPerSecond = 4.8e12;    // the floor of memory-bound work: bytes / this
constexpr double kBf16FlopsPerSecond = 758e12;   // the floor of compute-bound BF16 work: FLOPs / this
constexpr double kFp8FlopsPerSecond = 1341e12;   // of FP8 work: torch._scaled_mm's peak on an H200 (PERF.md)

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

[[noreturn]] inline void perf_needs_cuda(std::string_view family) {
  fail("backend_ops perf {} needs the CUDA backend: configure with -DBEAMLINE_CUDA=ON", family);
}

#ifdef BEAMLINE_HAVE_CUDA
inline void check_cuda(cudaError_t status, std::string_view family, std::string_view what) {
  require(status == cudaSuccess, "backend_ops perf {}: {} failed: {}", family, what, cudaGetErrorString(status));
}

// Median milliseconds of one call of `run` over `iterations` calls launched back to back, an event recorded on the
// backend's stream between every two.
inline double time_back_to_back(CudaBackend& backend, const std::function<void()>& run, int64_t iterations,
                                std::string_view family) {
  auto check = [family](cudaError_t status, const char* what) { check_cuda(status, family, what); };
  std::vector<cudaEvent_t> marks(static_cast<std::size_t>(iterations) + 1);
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");
  check(cudaEventRecord(marks[0], backend.stream()), "cudaEventRecord");
  for (std::size_t i = 1; i < marks.size(); ++i) {
    run();
    check(cudaEventRecord(marks[i], backend.stream()), "cudaEventRecord");
  }
  check(cudaEventSynchronize(marks.back()), "cudaEventSynchronize");
  std::vector<double> ms;
  for (std::size_t i = 1; i < marks.size(); ++i) {
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, marks[i - 1], marks[i]), "cudaEventElapsedTime");
    ms.push_back(elapsed);
  }
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
  return median(ms);
}

// Median milliseconds of one replay of a CUDA graph of `body`, after `body` ran once eagerly (the allocator's cache,
// cuBLAS plans, one-time tables) and the graph once untimed.
inline double time_graph(CudaBackend& backend, const std::function<void()>& body, int64_t iterations,
                         std::string_view family) {
  auto check = [family](cudaError_t status, const char* what) { check_cuda(status, family, what); };
  body();
  backend.synchronize();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(backend.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  body();
  check(cudaStreamEndCapture(backend.stream(), &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  auto replay = [&] { check(cudaGraphLaunch(exec, backend.stream()), "cudaGraphLaunch"); };
  replay();
  const double ms = time_back_to_back(backend, replay, iterations, family);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms;
}

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
#endif

}  // namespace beamline::backend_ops
