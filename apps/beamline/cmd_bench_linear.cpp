// beamline bench-linear: times the non-MoE weight reads of one decode step of a preset on the CUDA backend, per row
// count: a layer's q|k|v (linear_many) and o projections, a dense SwiGLU MLP and the LM head (soft cap included),
// each through the weight-streaming kernels (the backend's path for few rows) and through cuBLAS (the path for
// many rows) with split operands (--dtype float32) and with BF16 ones (--dtype bfloat16), replayed as CUDA graphs; prints a Markdown table next to the HBM floor (the
// weight bytes read once / 4.8 TB/s, PERF.md). Weights smaller than a few L2s are drawn in several copies that
// the graph cycles through, so that every replay reads them from HBM as a decode step does.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "commands.h"
#include "gpu_bench.h"
#include "util/error.h"

#ifdef BEAMLINE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace beamline::cli {
namespace {

struct BenchOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> rows{1, 2, 4, 16};
  int64_t iterations = 30;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA

void check(cudaError_t status, const char* what) { check_cuda(status, "bench-linear", what); }

// At least this many weight bytes per replay, so that L2 (60 MB on the H200) holds no weight between reads.
constexpr double kMinBytesPerReplay = 256e6;

// Median milliseconds of one call of `op`, captured `copies` times (one per weight copy) into a graph.
double time_graph(CudaBackend& backend, const std::function<void(int)>& op, int copies, int64_t iterations) {
  for (int c = 0; c < copies; ++c) op(c);  // warm-up: the allocator's cache, cuBLAS plans, one-time tables
  backend.synchronize();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  check(cudaStreamBeginCapture(backend.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int c = 0; c < copies; ++c) op(c);
  check(cudaStreamEndCapture(backend.stream(), &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&graph_exec, graph, 0), "cudaGraphInstantiate");
  std::vector<cudaEvent_t> marks(static_cast<std::size_t>(iterations) + 1);
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");
  check(cudaGraphLaunch(graph_exec, backend.stream()), "cudaGraphLaunch");
  check(cudaEventRecord(marks[0], backend.stream()), "cudaEventRecord");
  for (std::size_t i = 1; i < marks.size(); ++i) {
    check(cudaGraphLaunch(graph_exec, backend.stream()), "cudaGraphLaunch");
    check(cudaEventRecord(marks[i], backend.stream()), "cudaEventRecord");
  }
  check(cudaEventSynchronize(marks.back()), "cudaEventSynchronize");
  std::vector<double> ms;
  for (std::size_t i = 1; i < marks.size(); ++i) {
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, marks[i - 1], marks[i]), "cudaEventElapsedTime");
    ms.push_back(elapsed / copies);
  }
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
  cudaGraphExecDestroy(graph_exec);
  cudaGraphDestroy(graph);
  return median(ms);
}

void run_bench(const BenchOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(options.iterations >= 1, "bench-linear: --iterations must be >= 1");
  CudaBackend backend;
  const int64_t hidden = config.hidden_size, q_width = config.num_attention_heads * config.head_dim,
                kv_width = config.num_key_value_heads * config.head_dim, intermediate = config.intermediate_size,
                vocab = config.vocab_size;
  uint64_t seed = options.seed;
  auto weight = [&](std::vector<int64_t> shape, float stddev) {
    return LinearTensors{backend.random_weight(DType::BF16, std::move(shape), seed++, 0.0f, stddev), {}, {}};
  };
  auto copies_for = [](double bytes) { return static_cast<int>(std::max(1.0, std::ceil(kMinBytesPerReplay / bytes))); };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));

  const double qkv_bytes = 2.0 * static_cast<double>(hidden * (q_width + 2 * kv_width));
  const double o_bytes = 2.0 * static_cast<double>(q_width * hidden);
  const double mlp_bytes = 2.0 * 3.0 * static_cast<double>(hidden * intermediate);
  const double head_bytes = 2.0 * static_cast<double>(vocab * hidden);
  struct Attention {
    LinearTensors q, k, v, o;
  };
  std::vector<Attention> attention(static_cast<std::size_t>(copies_for(o_bytes)));
  for (Attention& a : attention) {
    a.q = weight({q_width, hidden}, in_scale);
    a.k = weight({kv_width, hidden}, in_scale);
    a.v = weight({kv_width, hidden}, in_scale);
    a.o = weight({hidden, q_width}, 1.0f / std::sqrt(static_cast<float>(q_width)));
  }
  const int qkv_copies = std::min(copies_for(qkv_bytes), static_cast<int>(attention.size()));
  const int o_copies = static_cast<int>(attention.size());
  std::vector<SwigluTensors> mlp(static_cast<std::size_t>(copies_for(mlp_bytes)));
  for (SwigluTensors& m : mlp) {
    m.gate = weight({intermediate, hidden}, in_scale);
    m.up = weight({intermediate, hidden}, in_scale);
    m.down = weight({hidden, intermediate}, 1.0f / std::sqrt(static_cast<float>(intermediate)));
  }
  const LinearTensors head = weight({vocab, hidden}, 4.0f * in_scale);
  const Tensor final_norm = backend.random_weight(DType::BF16, {hidden}, seed++, 0.0f, 1.0f);
  const auto eps = static_cast<float>(config.rms_norm_eps);
  const auto softcap = static_cast<float>(config.final_logit_softcapping);
  spdlog::info("bench-linear: {} on {}; copies: q|k|v {}, o {}, MLP {}", options.preset, backend.device_description(),
               qkv_copies, o_copies, mlp.size());

  std::printf("\n| op | weights | rows | floor ms | streaming ms | streaming TB/s | floor / streaming | cuBLAS split "
              "ms | cuBLAS BF16 ms | cuBLAS BF16 / streaming |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | "
              "--- |\n");
  for (const int64_t rows : options.rows) {
    require(rows >= 1, "bench-linear: --rows must be >= 1");
    const Tensor h = backend.random_weight(DType::F32, {rows, hidden}, seed++, 0.0f, 1.0f);
    const Tensor attended = backend.random_weight(DType::F32, {rows, q_width}, seed++, 0.0f, 1.0f);
    Tensor q = backend.alloc(DType::F32, {rows, q_width}), k = backend.alloc(DType::F32, {rows, kv_width}),
           v = backend.alloc(DType::F32, {rows, kv_width}), out = backend.alloc(DType::F32, {rows, hidden});
    std::vector<int32_t> picked(static_cast<std::size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) picked[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    const Tensor logit_rows = backend.upload_i32(picked, {rows});
    Tensor logits = backend.alloc(DType::F32, {rows, vocab});

    struct Op {
      const char* name;
      double bytes;
      int copies;
      int64_t streaming_rows;  // the most rows the backend streams the weights of this op for
      std::function<void(int)> run;
    };
    const std::array<Op, 4> ops{
        Op{"q, k, v (linear_many)", qkv_bytes, qkv_copies, CudaBackend::kStreamingMaxRows,
           [&](int c) {
             const Attention& a = attention[static_cast<std::size_t>(c)];
             const std::array<const LinearTensors*, 3> weights{&a.q, &a.k, &a.v};
             const std::array<Tensor*, 3> ys{&q, &k, &v};
             backend.linear_many(h, weights, ys);
           }},
        Op{"o", o_bytes, o_copies, CudaBackend::kStreamingSingleMaxRows,
           [&](int c) { backend.linear(attended, attention[static_cast<std::size_t>(c)].o, out); }},
        Op{"dense SwiGLU MLP", mlp_bytes, static_cast<int>(mlp.size()), CudaBackend::kStreamingSwigluMaxRows,
           [&](int c) { backend.swiglu(h, mlp[static_cast<std::size_t>(c)], out); }},
        Op{"LM head (norm + soft cap)", head_bytes, 1, CudaBackend::kStreamingMaxRows,
           [&](int) { backend.lm_head(h, logit_rows, final_norm, eps, head, softcap, logits); }},
    };
    for (const Op& op : ops) {
      backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      const bool streams = rows <= op.streaming_rows;
      const double streaming_ms = streams ? time_graph(backend, op.run, op.copies, options.iterations) : 0.0;
      backend.set_streaming_max_rows(0);
      const double split_ms = time_graph(backend, op.run, op.copies, options.iterations);
      backend.set_compute_dtype(ComputeDType::BFloat16);
      const double bf16_ms = time_graph(backend, op.run, op.copies, options.iterations);
      backend.set_compute_dtype(ComputeDType::Float32);
      backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      const double floor_ms = op.bytes / kHbmBytesPerSecond * 1e3;
      if (streams)
        std::printf("| %s | %.0f MB | %lld | %.4f | %.4f | %.2f | %.2f | %.4f | %.4f | %.2f |\n", op.name,
                    op.bytes / 1e6, static_cast<long long>(rows), floor_ms, streaming_ms,
                    op.bytes / (streaming_ms * 1e-3) / 1e12, floor_ms / streaming_ms, split_ms, bf16_ms,
                    bf16_ms / streaming_ms);
      else
        std::printf("| %s | %.0f MB | %lld | %.4f | — | — | — | %.4f | %.4f | — |\n", op.name, op.bytes / 1e6,
                    static_cast<long long>(rows), floor_ms, split_ms, bf16_ms);
    }
  }
}
#else
void run_bench(const BenchOptions&) { fail("bench-linear needs the CUDA backend: configure with -DBEAMLINE_CUDA=ON"); }
#endif

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench-linear", "Time a decode step's dense weight reads (q|k|v, o, dense SwiGLU MLP, LM head) of a preset on "
                      "the GPU per row count, weight-streaming kernels next to cuBLAS, as CUDA graphs, next to the "
                      "HBM floor");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--rows", options->rows, "activation rows (decode batch)")->delimiter(',')->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->callback([options] { run_bench(*options); });
});

}  // namespace
}  // namespace beamline::cli
