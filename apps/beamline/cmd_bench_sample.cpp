// beamline bench-sample: times Backend::sample on the CUDA backend over random FP32 logits of a preset's vocabulary
// (normal, stddev 4, as test-backend-ops draws them), per row count and filter mode, each call as the decode loop
// makes it (the row parameters uploaded, then the sampling kernels); prints a Markdown table next to the HBM floor
// (every sampled row read once, / 4.8 TB/s, PERF.md).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "commands.h"
#include "gpu_bench.h"
#include "sampling/sampling.h"
#include "util/error.h"

#ifdef BEAMLINE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace beamline::cli {
namespace {

struct BenchOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> rows{1, 8, 64, 512};
  std::vector<std::string> modes{"mixed", "greedy", "temperature", "top_k", "top_p", "min_p", "combined"};
  int64_t iterations = 30;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA
constexpr int64_t kTopWidth = 20;

void check(cudaError_t status, const char* what) { check_cuda(status, "bench-sample", what); }

SampleRow filtered(float temperature, float min_p, int32_t top_k, float top_p) {
  SampleRow row;
  row.temperature = temperature;
  row.min_p = min_p;
  row.top_k = top_k;
  row.top_p = top_p;
  return row;
}

// The settings of row `r` in `mode`; "mixed" cycles through test-backend-ops's eight modes and its logprob requests
// (none, the token's own, 5 or 20 of the best), so that its 8-row call is the harness's one-row-per-mode case.
SampleRow row_settings(const std::string& mode, int64_t r) {
  const std::vector<SampleRow> harness_modes{
      [] {
        SampleRow greedy;
        greedy.greedy = true;
        return greedy;
      }(),
      filtered(0.7f, 0.0f, 0, 1.0f),  filtered(1.0f, 0.0f, 1, 1.0f),   filtered(1.3f, 0.0f, 50, 1.0f),
      filtered(1.0f, 0.0f, 0, 0.9f),  filtered(1.0f, 0.0f, 0, 1e-6f),  filtered(1.0f, 0.1f, 0, 1.0f),
      filtered(0.8f, 0.05f, 40, 0.95f)};
  SampleRow row;
  if (mode == "mixed") {
    row = harness_modes[static_cast<std::size_t>(r) % harness_modes.size()];
    row.num_logprobs = r % 3 == 0 ? -1 : (r % 3 == 1 ? 0 : (r % 2 ? 5 : 20));
  } else if (mode == "greedy") {
    row = harness_modes[0];
  } else if (mode == "temperature") {
    row = harness_modes[1];
  } else if (mode == "top_k") {
    row = harness_modes[3];
  } else if (mode == "top_p") {
    row = harness_modes[4];
  } else if (mode == "min_p") {
    row = harness_modes[6];
  } else if (mode == "combined") {
    row = harness_modes[7];
  } else {
    fail("bench-sample: unknown mode {} (mixed, greedy, temperature, top_k, top_p, min_p, combined)", mode);
  }
  row.logit_row = static_cast<int32_t>(r);
  return row;
}

void run_bench(const BenchOptions& options) {
  require(options.iterations >= 1, "bench-sample: --iterations must be >= 1");
  const int64_t vocab = preset_config(options.preset).vocab_size;
  int64_t max_rows = 0;
  for (const int64_t rows : options.rows) {
    require(rows >= 1, "bench-sample: --rows must be >= 1");
    max_rows = std::max(max_rows, rows);
  }
  CudaBackend backend;
  spdlog::info("bench-sample: {} rows of V = {} on {}", max_rows, vocab, backend.device_description());
  const Tensor logits = backend.random_weight(DType::F32, {max_rows, vocab}, options.seed, 0.0f, 4.0f);
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);

  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::printf("\n| mode | rows | V | ms (median) | floor ms | floor / time |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const std::string& mode : options.modes) {
    for (const int64_t count : options.rows) {
      std::vector<SampleRow> rows;
      for (int64_t r = 0; r < count; ++r) rows.push_back(row_settings(mode, r));
      SampleOutputs out{backend.alloc(DType::I32, {count}), backend.alloc(DType::F32, {count}),
                        backend.alloc(DType::I32, {count}), backend.alloc(DType::I32, {count, kTopWidth}),
                        backend.alloc(DType::F32, {count, kTopWidth})};
      std::vector<double> ms;
      for (int64_t i = 0; i <= options.iterations; ++i) {
        for (SampleRow& row : rows) row.uniform = uniform(rng);
        check(cudaEventRecord(start, backend.stream()), "cudaEventRecord");
        backend.sample(logits, rows, out);
        check(cudaEventRecord(stop, backend.stream()), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float elapsed = 0;
        check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
        if (i > 0) ms.push_back(elapsed);  // the first call sets up the kernels' shared-memory limits
      }
      const double time_ms = median(ms);
      const double floor_ms = 4.0 * static_cast<double>(count * vocab) / kHbmBytesPerSecond * 1e3;
      std::printf("| %s | %lld | %lld | %.4f | %.4f | %.2f |\n", mode.c_str(), static_cast<long long>(count),
                  static_cast<long long>(vocab), time_ms, floor_ms, floor_ms / time_ms);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}
#else
void run_bench(const BenchOptions&) { fail("bench-sample needs the CUDA backend: configure with -DBEAMLINE_CUDA=ON"); }
#endif

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench-sample", "Time Backend::sample on the GPU over random logits of a preset's vocabulary, per row count and "
                      "filter mode, next to the HBM floor");
  command->add_option("--preset", options->preset, "model shape (its vocabulary size)")->capture_default_str();
  command->add_option("--rows", options->rows, "row counts")->delimiter(',')->capture_default_str();
  command->add_option("--mode", options->modes,
                      "filter modes, each a table section (mixed = test-backend-ops's eight modes and logprob "
                      "requests in turn; greedy, temperature, top_k, top_p, min_p, combined)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed calls per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the logits and the draws")->capture_default_str();
  command->callback([options] { run_bench(*options); });
});

}  // namespace
}  // namespace beamline::cli
