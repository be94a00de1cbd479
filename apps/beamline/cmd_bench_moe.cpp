// beamline bench-moe: times one MoE layer of a preset (the FP32 router with its group-limited top-k, and the
// experts) on the CUDA backend per token count, with random weights drawn on the device, replayed as a CUDA graph
// as the decode loop runs it; prints a Markdown table next to the HBM floor (the bytes of the router and of every
// expert the routing touched, read once, / 4.8 TB/s; PERF.md), for each compute dtype asked (--dtype: float32 =
// FP32-accurate split operands on the tensor cores, bfloat16 = one BF16 rounding, vLLM's precision). The router
// alone is timed as a graph of its own next to the bytes of its FP32 matrix / 4.8 TB/s (replayed back to back, the
// 5.2 MB matrix stays in L2, where in the layer the expert stream evicts it).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "commands.h"
#include "gpu_bench.h"
#include "model/beam_model.h"
#include "util/error.h"

#ifdef BEAMLINE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace beamline::cli {
namespace {

struct BenchOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> tokens{1, 16, 64, 256, 1024};
  std::vector<std::string> dtypes{"float32", "bfloat16"};
  int64_t iterations = 50;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA

void check(cudaError_t status, const char* what) { check_cuda(status, "bench-moe", what); }

// One row of the table: the layer for `tokens` tokens of activations drawn from `h_seed`.
void bench_tokens(CudaBackend& backend, const MoeTensors& moe, const RouterParams& router, const std::string& dtype,
                  int64_t tokens, uint64_t h_seed, const BenchOptions& options) {
  const int64_t hidden = moe.router.dim(1), experts = moe.router.dim(0);
  const int64_t intermediate = moe.experts.front().gate.weight.dim(0), top_k = router.top_k;
  Tensor h = backend.random_weight(DType::F32, {tokens, hidden}, h_seed, 0.0f, 1.0f);
  Tensor ids = backend.alloc(DType::I32, {tokens, top_k}), weights = backend.alloc(DType::F32, {tokens, top_k});
  Tensor out = backend.alloc(DType::F32, {tokens, hidden});
  auto layer = [&] {
    backend.route(h, moe.router, moe.router_bias, router, ids, weights);
    backend.moe(h, ids, weights, moe, out);
  };
  // Warm-up also fills the allocator's cache, so the capture below allocates nothing.
  for (int i = 0; i < 3; ++i) layer();
  backend.synchronize();

  std::vector<cudaEvent_t> marks(static_cast<std::size_t>(options.iterations) + 1);
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");
  auto time_runs = [&](auto&& run) {
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
    return median(ms);
  };
  const double eager_ms = time_runs(layer);

  auto time_graph = [&](auto&& body) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t graph_exec = nullptr;
    check(cudaStreamBeginCapture(backend.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    body();
    check(cudaStreamEndCapture(backend.stream(), &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&graph_exec, graph, 0), "cudaGraphInstantiate");
    const double ms = time_runs([&] { check(cudaGraphLaunch(graph_exec, backend.stream()), "cudaGraphLaunch"); });
    cudaGraphExecDestroy(graph_exec);
    cudaGraphDestroy(graph);
    return ms;
  };
  const double graph_ms = time_graph(layer);
  // The router alone (its logits and the group-limited top-k), the layer's fixed cost at few tokens.
  const double route_ms = time_graph([&] { backend.route(h, moe.router, moe.router_bias, router, ids, weights); });
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);

  const std::vector<int32_t> routed = backend.download_i32(ids);
  const std::set<int32_t> hit(routed.begin(), routed.end());
  const double bytes = 4.0 * static_cast<double>(experts * hidden) +
                       2.0 * 3.0 * static_cast<double>(hidden * intermediate) * static_cast<double>(hit.size());
  const double floor_ms = bytes / kHbmBytesPerSecond * 1e3;
  const double router_floor_ms = 4.0 * static_cast<double>(experts * hidden) / kHbmBytesPerSecond * 1e3;
  std::printf("| %s | %lld | %zu | %.3f | %.3f | %.3f | %.2f | %.2f | %.4f | %.4f |\n", dtype.c_str(),
              static_cast<long long>(tokens), hit.size(), graph_ms, eager_ms, floor_ms, floor_ms / graph_ms,
              bytes / (graph_ms * 1e-3) / 1e12, route_ms, router_floor_ms);
}

void run_bench(const BenchOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(config.n_routed_experts > 0, "bench-moe: preset {} has no MoE layers", options.preset);
  require(options.iterations >= 1, "bench-moe: --iterations must be >= 1");
  for (const int64_t tokens : options.tokens) require(tokens >= 1, "bench-moe: --tokens must be >= 1");
  CudaBackend backend;
  uint64_t seed = options.seed;
  // Near-zero router logits and no bias make the routing close to uniform over the experts, as in PERF.md's
  // measurements (16 tokens touch about 100 experts, 64 about 218, 256 nearly all), so the rows compare.
  const MoeTensors moe = random_moe_layer(backend, config, seed, 1e-3f, 0.0f);
  const RouterParams router = router_params(config);
  spdlog::info("bench-moe: {} MoE layer ({} experts x {}x{}, top {}) on {}", options.preset, config.n_routed_experts,
               config.moe_intermediate_size, config.hidden_size, config.num_experts_per_tok,
               backend.device_description());

  std::printf("\n| dtype | tokens | experts hit | MoE ms (route + experts, graph) | eager ms | floor ms | "
              "floor / time | TB/s | route ms (graph) | router floor ms |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const std::string& dtype : options.dtypes) {
    backend.set_compute_dtype(parse_compute_dtype(dtype, backend.device()));
    // The same activations (so the same routing and floor) for every dtype.
    for (std::size_t i = 0; i < options.tokens.size(); ++i)
      bench_tokens(backend, moe, router, dtype, options.tokens[i], seed + i, options);
  }
}
#else
void run_bench(const BenchOptions&) { fail("bench-moe needs the CUDA backend: configure with -DBEAMLINE_CUDA=ON"); }
#endif

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench-moe", "Time one MoE layer (router + experts) of a preset on the GPU with random on-device weights, per "
                   "token count, as a CUDA graph, next to the HBM floor");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--tokens", options->tokens, "token counts")->delimiter(',')->capture_default_str();
  command->add_option("--dtype", options->dtypes, "compute dtypes, each a table section (float32, bfloat16)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed runs per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->callback([options] { run_bench(*options); });
});

}  // namespace
}  // namespace beamline::cli
