// Gathered LoRA (Backend::lora) in test mode, against the reference, and in perf mode next to its byte floor: every
// row of a batch with its own adapter or none (mixed batches of several adapters, as a step of many requests is).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "harness.h"
#include "op_families.h"
#include "perf.h"

namespace beamline::backend_ops {
namespace {

// Each row's adapter: every fourth row none (-1), the others one of `adapters` at random (the first row always has
// one, so that a one-row case checks the adapter path).
std::vector<int32_t> random_indices(std::mt19937_64& rng, int64_t rows, int64_t adapters) {
  std::vector<int32_t> indices(static_cast<std::size_t>(rows));
  for (std::size_t t = 0; t < indices.size(); ++t)
    indices[t] = t % 4 == 3 ? -1 : static_cast<int32_t>(rng() % static_cast<uint64_t>(adapters));
  return indices;
}

}  // namespace

void test_lora(Harness& harness) {
  // (rows, adapters, rank, in, out): Beam-1.0's q and o projections at the ranks SkyRL trains (16, and 8 = 64 / top_k
  // for experts), an expert's down projection, odd sizes that leave the float4 loads, a rank above a warp's count.
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> cases{
      {37, 3, 7, 67, 131}, {5, 2, 64, 640, 512}, {1, 1, 8, 96, 33}, {9, 4, 33, 128, 300}};
  if (!harness.small_only())
    cases.insert(cases.end(), {{1, 1, 16, 5120, 6144}, {64, 8, 16, 5120, 6144}, {64, 8, 16, 6144, 5120},
                               {256, 16, 8, 2560, 5120}});
  for (auto [rows, adapters, rank, in, out] : cases) {
    const auto start = std::chrono::steady_clock::now();
    Inputs& inputs = harness.inputs();
    auto x = harness.f32(inputs.uniform(rows * in), {rows, in});
    auto a = harness.f32(inputs.uniform(adapters * rank * in, 0.05f), {adapters, rank, in});
    auto b = harness.f32(inputs.uniform(adapters * out * rank, 0.05f), {adapters, out, rank});
    auto indices = harness.i32(random_indices(inputs.rng(), rows, adapters), {rows});
    auto y = harness.f32(inputs.uniform(rows * out), {rows, out});  // added to: the rows without an adapter stay
    harness.device().lora(x.device, {a.device, b.device}, indices.device, y.device);
    harness.reference().lora(x.reference, {a.reference, b.reference}, indices.reference, y.reference);
    harness.record("lora", fmt::format("T {} adapters {} r {} {}->{}", rows, adapters, rank, in, out), y,
                   kF32Tolerance, seconds_since(start));
  }
}

namespace {

struct PerfOptions {
  std::vector<int64_t> rows{1, 16, 64, 256};
  int64_t adapters = 8, rank = 16, in = 5120, out = 6144, iterations = 50;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA
// Time per call of a graph of the op, next to the floor of the bytes it must move: the adapters the batch uses
// (a and b once each), x read, y read and written.
void run_perf(const PerfOptions& options) {
  CudaBackend backend;
  spdlog::info("perf lora: {} adapters of rank {}, {} -> {}, on {}", options.adapters, options.rank, options.in,
               options.out, backend.device_description());
  uint64_t seed = options.seed;
  const LoraTensors lora{backend.random_weight(DType::F32, {options.adapters, options.rank, options.in}, seed++, 0, 0.02f),
                         backend.random_weight(DType::F32, {options.adapters, options.out, options.rank}, seed++, 0, 0.02f)};
  std::mt19937_64 rng(options.seed);
  std::printf("\n| rows | adapters used | rank | in -> out | us (median) | floor us | floor / time |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int64_t rows : options.rows) {
    const Tensor x = backend.random_weight(DType::F32, {rows, options.in}, seed++, 0, 1.0f);
    Tensor y = backend.random_weight(DType::F32, {rows, options.out}, seed++, 0, 1.0f);
    const std::vector<int32_t> host = random_indices(rng, rows, options.adapters);
    const Tensor indices = backend.upload_i32(host, {rows});
    std::set<int32_t> used(host.begin(), host.end());
    used.erase(-1);
    const double adapter_bytes = 4.0 * static_cast<double>(used.size()) * static_cast<double>(options.rank) *
                                 static_cast<double>(options.in + options.out);
    const double bytes = adapter_bytes + 4.0 * static_cast<double>(rows) * static_cast<double>(options.in + 2 * options.out);
    const double ms = time_graph(backend, [&] { backend.lora(x, lora, indices, y); }, options.iterations, "lora");
    const double floor_ms = bytes / kHbmBytesPerSecond * 1e3;
    std::printf("| %lld | %zu | %lld | %lld -> %lld | %.2f | %.2f | %.2f |\n", static_cast<long long>(rows), used.size(),
                static_cast<long long>(options.rank), static_cast<long long>(options.in),
                static_cast<long long>(options.out), ms * 1e3, floor_ms * 1e3, floor_ms / ms);
  }
}
#endif

}  // namespace

void add_lora_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "lora", "Time Backend::lora (gathered LoRA) on the GPU, rows of random adapters, next to the byte floor");
  command->add_option("--rows", options->rows, "row counts")->delimiter(',')->capture_default_str();
  command->add_option("--adapters", options->adapters, "stacked adapters")->capture_default_str();
  command->add_option("--rank", options->rank, "rank R")->capture_default_str();
  command->add_option("--in", options->in, "input width")->capture_default_str();
  command->add_option("--out", options->out, "output width")->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays (median reported)")->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("lora");
#endif
  });
}

}  // namespace beamline::backend_ops
