// beamline bench-fp8: FP8 block-128 weights (MODEL_FORMAT.md section 5 "fp8") on the CUDA backend, random codes and
// scales drawn on the device. Two tables, every figure next to its floor (PERF.md: bytes incl. scales / 4.8 TB/s, and
// FLOPs / 1,341 TFLOP/s, the FP8 peak torch._scaled_mm reached on an H200; the larger of the two):
//  - one MoE layer of the preset (FP32 router with its group-limited top-k, then the FP8 experts) per token count,
//    replayed as a CUDA graph, as bench-moe does for BF16;
//  - the dense projections per row count (q|k|v, o, the dense SwiGLU MLP, the LM head, and a square prefill GEMM),
//    as graphs over enough weight copies that L2 holds none between reads; at the streamed row counts (W8A16) also
//    the FP8 wgmma path (W8A8) for comparison.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
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

constexpr double kFp8FlopsPerSecond = 1341e12;  // torch._scaled_mm on an H200 (PERF.md)

struct BenchOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> tokens{1, 16, 64, 256, 1024, 8192};
  std::vector<int64_t> rows{1, 2, 4, 8, 64, 1024};
  int64_t iterations = 20;
  uint64_t seed = 1;
  bool moe = true, linear = true;
};

#ifdef BEAMLINE_HAVE_CUDA

void check(cudaError_t status, const char* what) { check_cuda(status, "bench-fp8", what); }

int64_t blocks128(int64_t n) { return (n + 127) / 128; }

// Codes e4m3(normal(0, 64)) and one scale per block, so that the weights are about normal(0, stddev).
LinearTensors fp8_weight(CudaBackend& backend, int64_t out, int64_t in, uint64_t& seed, float stddev) {
  LinearTensors w;
  w.weight = backend.random_weight(DType::F8_E4M3, {out, in}, seed++, 0.0f, 64.0f);
  w.scale = backend.random_weight(DType::F32, {blocks128(out), blocks128(in)}, seed++, stddev / 64.0f, 0.0f);
  return w;
}

double fp8_bytes(int64_t out, int64_t in) {
  return static_cast<double>(out * in) + 4.0 * static_cast<double>(blocks128(out) * blocks128(in));
}

// Median milliseconds of one replay of a graph of `body`, after `body` ran once eagerly (allocator cache, tables).
double time_graph(CudaBackend& backend, const std::function<void()>& body, int64_t iterations) {
  body();
  backend.synchronize();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(backend.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  body();
  check(cudaStreamEndCapture(backend.stream(), &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  std::vector<cudaEvent_t> marks(static_cast<std::size_t>(iterations) + 1);
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");
  check(cudaGraphLaunch(exec, backend.stream()), "cudaGraphLaunch");
  check(cudaEventRecord(marks[0], backend.stream()), "cudaEventRecord");
  for (std::size_t i = 1; i < marks.size(); ++i) {
    check(cudaGraphLaunch(exec, backend.stream()), "cudaGraphLaunch");
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
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return median(ms);
}

void bench_moe(CudaBackend& backend, const ModelConfig& config, uint64_t& seed, const BenchOptions& options) {
  const int64_t hidden = config.hidden_size, inter = config.moe_intermediate_size, experts = config.n_routed_experts;
  MoeTensors moe;
  // Near-zero router logits and no bias: close to uniform routing, as in PERF.md's floors.
  moe.router = backend.random_weight(DType::F32, {experts, hidden}, seed++, 0.0f, 1e-3f);
  moe.router_bias = backend.random_weight(DType::F32, {experts}, seed++, 0.0f, 0.0f);
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  const float down_scale = 1.0f / std::sqrt(static_cast<float>(inter));
  for (int64_t e = 0; e < experts; ++e)
    moe.experts.push_back({fp8_weight(backend, inter, hidden, seed, in_scale),
                           fp8_weight(backend, inter, hidden, seed, in_scale),
                           fp8_weight(backend, hidden, inter, seed, down_scale)});
  backend.prepare_moe(moe);
  const RouterParams router = router_params(config);
  std::printf("\n| tokens | experts hit | FP8 MoE ms (route + experts, graph) | route ms | floor ms (bytes) | "
              "floor ms (FLOPs) | floor / time | TB/s | TFLOP/s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int64_t tokens : options.tokens) {
    const Tensor h = backend.random_weight(DType::F32, {tokens, hidden}, seed++, 0.0f, 1.0f);
    Tensor ids = backend.alloc(DType::I32, {tokens, router.top_k}), weights = backend.alloc(DType::F32, {tokens, router.top_k});
    Tensor out = backend.alloc(DType::F32, {tokens, hidden});
    auto layer = [&] {
      backend.route(h, moe.router, moe.router_bias, router, ids, weights);
      backend.moe(h, ids, weights, moe, out);
    };
    const double ms = time_graph(backend, layer, options.iterations);
    const double route_ms = time_graph(
        backend, [&] { backend.route(h, moe.router, moe.router_bias, router, ids, weights); }, options.iterations);
    const std::vector<int32_t> routed = backend.download_i32(ids);
    const std::set<int32_t> hit(routed.begin(), routed.end());
    const double bytes = 4.0 * static_cast<double>(experts * hidden) +
                         static_cast<double>(hit.size()) * (2.0 * fp8_bytes(inter, hidden) + fp8_bytes(hidden, inter));
    const double flops = 2.0 * 3.0 * static_cast<double>(hidden * inter) * static_cast<double>(tokens * router.top_k);
    const double bytes_ms = bytes / kHbmBytesPerSecond * 1e3, flops_ms = flops / kFp8FlopsPerSecond * 1e3;
    std::printf("| %lld | %zu | %.4f | %.4f | %.4f | %.4f | %.2f | %.2f | %.0f |\n", static_cast<long long>(tokens),
                hit.size(), ms, route_ms, bytes_ms, flops_ms, std::max(bytes_ms, flops_ms) / ms,
                bytes / (ms * 1e-3) / 1e12, flops / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
  }
}

void bench_linear(CudaBackend& backend, const ModelConfig& config, uint64_t& seed, const BenchOptions& options) {
  const int64_t hidden = config.hidden_size, q_width = config.num_attention_heads * config.head_dim,
                kv_width = config.num_key_value_heads * config.head_dim, inter = config.intermediate_size,
                vocab = config.vocab_size;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  // Copies so that one replay reads at least 256 MB of weights: L2 (60 MB) holds none between reads.
  auto copies_for = [](double bytes) { return static_cast<int>(std::max(1.0, std::ceil(256e6 / bytes))); };
  struct Attention {
    LinearTensors q, k, v, o;
  };
  const double qkv_bytes = fp8_bytes(q_width, hidden) + 2.0 * fp8_bytes(kv_width, hidden);
  const double o_bytes = fp8_bytes(hidden, q_width);
  const double mlp_bytes = 2.0 * fp8_bytes(inter, hidden) + fp8_bytes(hidden, inter);
  const double head_bytes = fp8_bytes(vocab, hidden);
  std::vector<Attention> attention(static_cast<std::size_t>(copies_for(o_bytes)));
  for (Attention& a : attention) {
    a.q = fp8_weight(backend, q_width, hidden, seed, in_scale);
    a.k = fp8_weight(backend, kv_width, hidden, seed, in_scale);
    a.v = fp8_weight(backend, kv_width, hidden, seed, in_scale);
    a.o = fp8_weight(backend, hidden, q_width, seed, in_scale);
  }
  std::vector<SwigluTensors> mlp(static_cast<std::size_t>(copies_for(mlp_bytes)));
  for (SwigluTensors& m : mlp)
    m = {fp8_weight(backend, inter, hidden, seed, in_scale), fp8_weight(backend, inter, hidden, seed, in_scale),
         fp8_weight(backend, hidden, inter, seed, 1.0f / std::sqrt(static_cast<float>(inter)))};
  const LinearTensors head = fp8_weight(backend, vocab, hidden, seed, 4.0f * in_scale);
  const Tensor norm = backend.random_weight(DType::BF16, {hidden}, seed++, 0.0f, 1.0f);
  std::printf("\n| op | weights | rows | floor ms | beamline ms (path) | floor / time | TB/s | TFLOP/s | wgmma ms at "
              "streamed rows |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int64_t rows : options.rows) {
    const Tensor h = backend.random_weight(DType::F32, {rows, hidden}, seed++, 0.0f, 1.0f);
    const Tensor attended = backend.random_weight(DType::F32, {rows, q_width}, seed++, 0.0f, 1.0f);
    Tensor q = backend.alloc(DType::F32, {rows, q_width}), k = backend.alloc(DType::F32, {rows, kv_width}),
           v = backend.alloc(DType::F32, {rows, kv_width}), out = backend.alloc(DType::F32, {rows, hidden});
    const int64_t head_rows = std::min<int64_t>(rows, 64);  // the LM head sees sampled rows only
    std::vector<int32_t> picked(static_cast<std::size_t>(head_rows));
    for (int64_t i = 0; i < head_rows; ++i) picked[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    const Tensor logit_rows = backend.upload_i32(picked, {head_rows});
    Tensor logits = backend.alloc(DType::F32, {head_rows, vocab});
    struct Op {
      const char* name;
      double bytes, flops;
      int64_t rows;
      std::function<void()> run;
    };
    const int qkv_copies = std::min<int>(copies_for(qkv_bytes), static_cast<int>(attention.size()));
    std::vector<Op> ops{
        {"q, k, v (linear_many)", qkv_bytes, 2.0 * static_cast<double>(rows * hidden * (q_width + 2 * kv_width)), rows,
         [&] {
           for (int c = 0; c < qkv_copies; ++c) {
             const Attention& a = attention[static_cast<std::size_t>(c)];
             const std::array<const LinearTensors*, 3> weights{&a.q, &a.k, &a.v};
             const std::array<Tensor*, 3> ys{&q, &k, &v};
             backend.linear_many(h, weights, ys);
           }
         }},
        {"o", o_bytes, 2.0 * static_cast<double>(rows * hidden * q_width), rows,
         [&] {
           for (const Attention& a : attention) backend.linear(attended, a.o, out);
         }},
        {"dense SwiGLU MLP", mlp_bytes, 6.0 * static_cast<double>(rows * hidden * inter), rows,
         [&] {
           for (const SwigluTensors& m : mlp) backend.swiglu(h, m, out);
         }},
        {"LM head (norm + soft cap)", head_bytes, 2.0 * static_cast<double>(head_rows * hidden * vocab), head_rows,
         [&] { backend.lm_head(h, logit_rows, norm, 1e-6f, head, 30.0f, logits); }}};
    const int copies[] = {qkv_copies, static_cast<int>(attention.size()), static_cast<int>(mlp.size()), 1};
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (i == 3 && rows > 64) continue;
      backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      const double ms = time_graph(backend, op.run, options.iterations) / copies[i];
      const bool streamed = op.rows <= CudaBackend::kFp8StreamingMaxRows;
      double wgmma_ms = 0.0;
      if (streamed) {
        backend.set_streaming_max_rows(0);
        wgmma_ms = time_graph(backend, op.run, options.iterations) / copies[i];
        backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      }
      const double floor_ms = std::max(op.bytes / kHbmBytesPerSecond, op.flops / kFp8FlopsPerSecond) * 1e3;
      std::printf("| %s | %.0f MB | %lld | %.4f | %.4f (%s) | %.2f | %.2f | %.0f | %s |\n", op.name, op.bytes / 1e6,
                  static_cast<long long>(op.rows), floor_ms, ms, streamed ? "W8A16 streamed" : "W8A8 wgmma",
                  floor_ms / ms, op.bytes / (ms * 1e-3) / 1e12, op.flops / (ms * 1e-3) / 1e12,
                  streamed ? fmt::format("{:.4f}", wgmma_ms).c_str() : "—");
      std::fflush(stdout);
    }
  }
}

void run_bench(const BenchOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(options.iterations >= 1, "bench-fp8: --iterations must be >= 1");
  CudaBackend backend;
  uint64_t seed = options.seed;
  spdlog::info("bench-fp8: {} on {}", options.preset, backend.device_description());
  if (options.linear) bench_linear(backend, config, seed, options);
  if (options.moe && config.n_routed_experts > 0) bench_moe(backend, config, seed, options);
}
#else
void run_bench(const BenchOptions&) { fail("bench-fp8 needs the CUDA backend: configure with -DBEAMLINE_CUDA=ON"); }
#endif

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench-fp8", "Time FP8 block-128 weights on the GPU (one MoE layer per token count; the dense projections per "
                   "row count) with random on-device codes, as CUDA graphs, next to the bytes and FLOP floors");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--tokens", options->tokens, "MoE token counts")->delimiter(',')->capture_default_str();
  command->add_option("--rows", options->rows, "projection row counts")->delimiter(',')->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->add_flag("!--no-moe", options->moe, "skip the MoE table");
  command->add_flag("!--no-linear", options->linear, "skip the projections table");
  command->callback([options] { run_bench(*options); });
});

}  // namespace
}  // namespace beamline::cli
