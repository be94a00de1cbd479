// The roofs of this GPU in perf mode (`perf roof`), measured in the same call as the rows they bound (issue 21: a
// goal that is missed says what, measured, limits it):
//   read  the best HBM read bandwidth a plain kernel gets here: roof_read.cu's streaming read, every configuration
//         (threads, loads per iteration, load kind) at each byte count the timed rows read (decode attention, a one-token
//         MoE layer, a decode step), the best per count;
//   GEMM  what cuBLAS's dense BF16 GEMM (FP32 accumulation, BF16 out) reaches on the same FLOPs as a row: 8192^3 (the
//         FLOP floor's own definition), the MoE layer's expert work at 1,024 and 8,192 tokens as dense GEMMs (tokens x
//         top-k rows), and the GEMMs of one prefill step of a preset cut to some layers (the projections, dense MLPs
//         and routed experts whose FLOPs make the prefill's GEMM-FLOP floor: 67.1 ms for 8,192 tokens of Beam-1.0's
//         8 layers; not the router, not attention).
// Not a backend op, no test: the numbers are the measure, not the kernels.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "op_families.h"
#include "perf.h"

#ifdef BEAMLINE_HAVE_CUDA
#include "roof_read.h"
#endif

namespace beamline::backend_ops {
namespace {

struct PerfOptions {
  // Bytes (MB, 1e6) of the rows the read roof bounds: decode attention B=1 L=128K, a one-token MoE layer (8 experts
  // and the router), B=32 L=8K, B=128 L=4K, and the batch-1 decode step of Beam-1.0 cut to 8 layers.
  std::vector<int64_t> megabytes{537, 634, 1074, 2147, 8293};
  std::string preset = "beam-1.0";
  int64_t layers = 8;
  std::vector<int64_t> moe_tokens{1024, 8192};
  int64_t prefill_tokens = 8192;
  int64_t iterations = 10;
  bool no_gemm = false;
};

#ifdef BEAMLINE_HAVE_CUDA

void check(cudaError_t status, const char* what) { check_cuda(status, "roof", what); }

void check_blas(cublasStatus_t status, const char* what) {
  require(status == CUBLAS_STATUS_SUCCESS, "backend_ops perf roof: {} failed: cuBLAS status {}", what,
          static_cast<int>(status));
}

struct ReadResult {
  RoofReadConfig config;
  int blocks_per_sm;
  double ms;
};

const char* load_name(RoofLoad load) {
  return load == RoofLoad::ReadOnly ? "ld.global.nc" : "ld.global.nc.L1::no_allocate.L2::256B";
}

std::string config_name(const RoofReadConfig& config) {
  return fmt::format("{} threads x {} loads, {}", config.threads, config.unroll, load_name(config.load));
}

// Median ms of reading `bytes` at `config`, each launch at the next offset of the buffer (so that L2 holds none of it).
double time_read(CudaBackend& backend, const std::byte* buffer, int64_t buffer_bytes, int64_t bytes,
                 const RoofReadConfig& config, int blocks, unsigned* sink, int64_t iterations) {
  const int64_t step = (bytes + 4095) / 4096 * 4096;
  const int64_t offsets = std::max<int64_t>(1, (buffer_bytes - bytes) / step + 1);
  int64_t launch = 0;
  auto read = [&] {
    check(launch_roof_read(buffer + (launch++ % offsets) * step, bytes, config, blocks, sink, backend.stream()),
          "roof read launch");
  };
  for (int i = 0; i < 2; ++i) read();
  return time_back_to_back(backend, read, iterations, "roof");
}

// MB (1e6 bytes) as a byte count the kernel reads: a multiple of its 16-byte loads.
int64_t read_bytes(int64_t megabytes) { return megabytes * 1000000 / 16 * 16; }

void read_roof(CudaBackend& backend, const PerfOptions& options) {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  for (const int64_t mb : options.megabytes) require(mb >= 1, "perf roof: --megabytes must be >= 1");
  const int64_t largest_mb = *std::max_element(options.megabytes.begin(), options.megabytes.end());
  const int64_t smallest_mb = *std::min_element(options.megabytes.begin(), options.megabytes.end());
  // The largest count, and at least 4 distinct offsets for the smallest.
  const int64_t buffer_bytes = std::max(read_bytes(largest_mb), 4 * read_bytes(smallest_mb));
  Tensor buffer_tensor = backend.alloc(DType::U8, {buffer_bytes});
  backend.fill_zero(buffer_tensor);
  const Tensor sink_tensor = backend.alloc(DType::I32, {1});
  const std::byte* buffer = buffer_tensor.raw();
  auto* sink = sink_tensor.data<unsigned>();
  std::vector<RoofReadConfig> configs;
  for (const RoofLoad load : {RoofLoad::ReadOnly, RoofLoad::NoAllocate})
    for (const int threads : {256, 512, 1024})
      for (const int unroll : {4, 8, 16}) configs.push_back({threads, unroll, load});

  std::vector<ReadResult> best;
  std::vector<ReadResult> largest;  // every configuration at the largest count
  for (const int64_t mb : options.megabytes) {
    const int64_t bytes = read_bytes(mb);
    ReadResult top{configs.front(), 0, 0.0};
    for (const RoofReadConfig& config : configs) {
      const int per_sm = roof_read_blocks_per_sm(config);
      if (per_sm == 0) continue;
      const double ms = time_read(backend, buffer, buffer_bytes, bytes, config, sms * per_sm, sink, options.iterations);
      if (top.ms == 0.0 || ms < top.ms) top = {config, per_sm, ms};
      if (mb == largest_mb) largest.push_back({config, per_sm, ms});
    }
    best.push_back(top);
  }

  const auto largest_bytes = static_cast<double>(read_bytes(largest_mb));
  std::printf("\nEvery configuration of the streaming read at %.0f MB:\n\n| threads | blocks per SM | loads per "
              "iteration | load | ms | TB/s | share of 4.8 TB/s |\n| --- | --- | --- | --- | --- | --- | --- |\n",
              largest_bytes / 1e6);
  for (const ReadResult& r : largest) {
    const double tbs = largest_bytes / (r.ms * 1e-3) / 1e12;
    std::printf("| %d | %d | %d | %s | %.4f | %.2f | %.2f |\n", r.config.threads, r.blocks_per_sm, r.config.unroll,
                load_name(r.config.load), r.ms, tbs, tbs * 1e12 / kHbmBytesPerSecond);
  }
  std::printf("\n| read roof: bytes read | best configuration | ms | TB/s | share of 4.8 TB/s |\n"
              "| --- | --- | --- | --- | --- |\n");
  for (std::size_t i = 0; i < best.size(); ++i) {
    const auto bytes = static_cast<double>(read_bytes(options.megabytes[i]));
    const double tbs = bytes / (best[i].ms * 1e-3) / 1e12;
    std::printf("| %.0f MB | %s | %.4f | %.2f | %.2f |\n", bytes / 1e6, config_name(best[i].config).c_str(), best[i].ms,
                tbs, tbs * 1e12 / kHbmBytesPerSecond);
  }
  std::fflush(stdout);
}

// One GEMM shape of a set: y [rows, out] = x [rows, in] . w [out, in]^T, `times` times per unit of work.
struct Gemm {
  int64_t rows, in, out, times;
};

struct GemmSet {
  std::string work;
  std::vector<Gemm> gemms;
};

std::vector<GemmSet> gemm_sets(const PerfOptions& options) {
  const ModelConfig config = with_num_layers(preset_config(options.preset), options.layers);
  const int64_t hidden = config.hidden_size, top_k = config.num_experts_per_tok, moe = config.moe_intermediate_size;
  std::vector<GemmSet> sets{{"GEMM 8192 x 8192 x 8192", {{8192, 8192, 8192, 1}}}};
  for (const int64_t tokens : options.moe_tokens) {
    require(tokens >= 1, "perf roof: --moe-tokens must be >= 1");
    sets.push_back({fmt::format("MoE {} tokens as dense GEMMs", tokens),
                    {{tokens * top_k, hidden, 2 * moe, 1}, {tokens * top_k, moe, hidden, 1}}});
  }
  const int64_t p = options.prefill_tokens, layers = config.num_hidden_layers;
  const int64_t dense = std::min(config.first_k_dense_replace, layers), moe_layers = layers - dense;
  const int64_t q_width = config.num_attention_heads * config.head_dim;
  const int64_t qkv = q_width + 2 * config.num_key_value_heads * config.head_dim;
  GemmSet prefill{fmt::format("prefill {} tokens, {} {} layers' GEMMs", p, layers, options.preset),
                  {{p, hidden, qkv, layers}, {p, q_width, hidden, layers}}};
  if (dense > 0) {
    prefill.gemms.push_back({p, hidden, 2 * config.intermediate_size, dense});
    prefill.gemms.push_back({p, config.intermediate_size, hidden, dense});
  }
  if (moe_layers > 0 && config.n_routed_experts > 0) {
    prefill.gemms.push_back({p * top_k, hidden, 2 * moe, moe_layers});
    prefill.gemms.push_back({p * top_k, moe, hidden, moe_layers});
  }
  sets.push_back(prefill);
  return sets;
}

void gemm_roof(CudaBackend& backend, const PerfOptions& options) {
  cublasHandle_t handle = nullptr;
  check_blas(cublasCreate(&handle), "cublasCreate");
  check_blas(cublasSetStream(handle, backend.stream()), "cublasSetStream");
  Tensor workspace = backend.alloc(DType::U8, {32 << 20});
  check_blas(cublasSetWorkspace(handle, workspace.raw(), workspace.nbytes()), "cublasSetWorkspace");
  std::printf("\n| GEMM roof: work | GEMMs (rows x in -> out, times) | TFLOP | cuBLAS ms | TFLOP/s | FLOP floor ms | "
              "floor / cuBLAS |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  uint64_t seed = 1;
  for (const GemmSet& set : gemm_sets(options)) {
    double flops = 0.0, ms = 0.0;
    std::string shapes;
    for (const Gemm& g : set.gemms) {
      const Tensor x = backend.random_weight(DType::BF16, {g.rows, g.in}, seed++, 0.0f, 1.0f);
      const Tensor w = backend.random_weight(DType::BF16, {g.out, g.in}, seed++, 0.0f, 1.0f);
      Tensor y = backend.alloc(DType::BF16, {g.rows, g.out});
      const float one = 1.0f, zero = 0.0f;
      auto gemm = [&] {
        // Column-major view: y^T [out, rows] = w [in, out]^T . x^T [in, rows].
        check_blas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.out), static_cast<int>(g.rows),
                                static_cast<int>(g.in), &one, w.raw(), CUDA_R_16BF, static_cast<int>(g.in), x.raw(),
                                CUDA_R_16BF, static_cast<int>(g.in), &zero, y.raw(), CUDA_R_16BF,
                                static_cast<int>(g.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
      };
      for (int i = 0; i < 2; ++i) gemm();
      ms += time_back_to_back(backend, gemm, options.iterations, "roof") * static_cast<double>(g.times);
      flops += 2.0 * static_cast<double>(g.rows) * static_cast<double>(g.in) * static_cast<double>(g.out) *
               static_cast<double>(g.times);
      shapes += fmt::format("{}{} x {} -> {}{}", shapes.empty() ? "" : ", ", g.rows, g.in, g.out,
                            g.times > 1 ? fmt::format(" (x{})", g.times) : "");
    }
    const double floor_ms = flops / kBf16FlopsPerSecond * 1e3;
    std::printf("| %s | %s | %.2f | %.3f | %.1f | %.3f | %.2f |\n", set.work.c_str(), shapes.c_str(), flops / 1e12, ms,
                flops / (ms * 1e-3) / 1e12, floor_ms, floor_ms / ms);
    std::fflush(stdout);
  }
  cublasDestroy(handle);
}

void run_perf(const PerfOptions& options) {
  require(options.iterations >= 1, "perf roof: --iterations must be >= 1");
  require(!options.megabytes.empty(), "perf roof: --megabytes needs at least one count");
  CudaBackend backend;
  spdlog::info("perf roof: {}", backend.device_description());
  read_roof(backend, options);
  if (!options.no_gemm) gemm_roof(backend, options);
  std::printf("\nmedian of %lld back-to-back launches each; the read roof's buffer is zeroed (its values do not change "
              "a read), the GEMMs' operands are normal(0, 1) BF16\n",
              static_cast<long long>(options.iterations));
}
#endif

}  // namespace

void add_roof_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "roof", "Measure this GPU's roofs: the best HBM read bandwidth of a plain streaming-read kernel per byte count, "
              "and cuBLAS's dense BF16 GEMM on the FLOPs of MoE layers and a prefill step");
  command->add_option("--megabytes", options->megabytes, "byte counts (MB, 1e6) of the read roof")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--preset", options->preset, "model shape of the GEMM sets")->capture_default_str();
  command->add_option("--layers", options->layers, "layers of the preset in the prefill set")->capture_default_str();
  command->add_option("--moe-tokens", options->moe_tokens, "token counts of the MoE GEMM sets")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--prefill-tokens", options->prefill_tokens, "tokens of the prefill step's GEMM set")
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed launches per case (median reported)")
      ->capture_default_str();
  command->add_flag("--no-gemm", options->no_gemm, "the read roof only");
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("roof");
#endif
  });
}

}  // namespace beamline::backend_ops
