// beamline bench-attention: times paged attention on the CUDA backend at Beam-1.0's shapes (48 query heads,
// 8 kv heads x 128, block size 16) over a random BF16 KV pool drawn on the device: decode batches (global and
// sliding window) and prefill, each next to its floor (KV bytes / 4.8 TB/s for decode, FLOPs / 758 TFLOP/s for
// prefill, PERF.md). --dtype picks the backend's compute dtype (the prefill kernel's tensor-core operands: float32
// = hi + lo BF16 pairs, bfloat16 = one rounding). Prints a Markdown table; bench/torch_attention_peers.py prints the
// same for PyTorch.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

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
  int64_t iterations = 15;
  int64_t repeats = 10;
  uint64_t seed = 1;
  std::string filter;
  std::string dtype = "float32";
};

#ifdef BEAMLINE_HAVE_CUDA
constexpr int64_t kHeads = 48, kKvHeads = 8, kDim = 128;
constexpr int32_t kBlockSize = 16, kWindow = 512;
// Batches whose KV fits in L2 (60 MB) are replicated over this many bytes of the pool, used in turn.
constexpr double kRotationBytes = 512e6;

struct Case {
  std::string name;
  int64_t batch;   // sequences
  int64_t cached;  // positions already in the cache before this step
  int64_t added;   // query rows per sequence
  int32_t window;
};

void check(cudaError_t status, const char* what) { check_cuda(status, "bench-attention", what); }

int64_t visible_keys(int64_t position, int32_t window) {
  return window > 0 ? std::min<int64_t>(position + 1, window) : position + 1;
}

void run_bench(const BenchOptions& options) {
  require(options.iterations >= 1 && options.repeats >= 1, "bench-attention: --iterations and --repeats must be >= 1");
  const std::vector<Case> cases{
      {"decode global B=1 L=8K", 1, 8191, 1, 0},
      {"decode global B=1 L=128K", 1, 131071, 1, 0},
      {"decode global B=32 L=8K", 32, 8191, 1, 0},
      {"decode global B=128 L=4K", 128, 4095, 1, 0},
      {"decode window-512 B=1 L=8K", 1, 8191, 1, kWindow},
      {"decode window-512 B=128 L=4K", 128, 4095, 1, kWindow},
      {"prefill causal 8K tokens", 1, 0, 8192, 0},
      {"prefill window-512 32K tokens", 1, 0, 32768, kWindow},
  };
  CudaBackend backend;
  backend.set_compute_dtype(options.dtype == "float32" ? ComputeDType::Float32 : ComputeDType::BFloat16);
  int64_t pool_blocks = 0;
  for (const Case& c : cases) {
    const int64_t per_sequence = (c.cached + c.added + kBlockSize - 1) / kBlockSize;
    pool_blocks = std::max(pool_blocks, c.batch * per_sequence);
  }
  const std::vector<int64_t> pool_shape{pool_blocks, 1, kBlockSize, kKvHeads, kDim};
  PagedKvPool pool{backend.random_weight(DType::BF16, pool_shape, options.seed, 0.0f, 1.0f),
                   backend.random_weight(DType::BF16, pool_shape, options.seed + 1, 0.0f, 1.0f)};
  const double block_bytes = 2.0 * 2.0 * kBlockSize * kKvHeads * kDim;  // K and V, BF16
  spdlog::info("bench-attention: {}, BF16 KV pool of {} blocks ({:.2f} GiB), compute dtype {}",
               backend.device_description(), pool_blocks, static_cast<double>(pool_blocks) * block_bytes / (1ull << 30),
               options.dtype);
  std::mt19937_64 rng(options.seed);
  cudaEvent_t marks[2];
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");

  std::printf("\n| case | ms | bytes or FLOPs | achieved | floor ms | %% of floor |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const Case& c : cases) {
    if (!options.filter.empty() && c.name.find(options.filter) == std::string::npos) continue;
    const int64_t per_sequence = (c.cached + c.added + kBlockSize - 1) / kBlockSize;
    const int64_t rows = c.batch * c.added;
    std::vector<int32_t> positions, query_start{0}, seq_lens;
    double keys = 0.0, pairs = 0.0;  // KV positions read per kv head; (query row, key) pairs
    for (int64_t s = 0; s < c.batch; ++s) {
      for (int64_t i = 0; i < c.added; ++i) {
        positions.push_back(static_cast<int32_t>(c.cached + i));
        pairs += static_cast<double>(visible_keys(c.cached + i, c.window));
      }
      query_start.push_back(static_cast<int32_t>((s + 1) * c.added));
      seq_lens.push_back(static_cast<int32_t>(c.cached + c.added));
      keys += static_cast<double>(c.window > 0 ? std::min<int64_t>(c.cached + c.added, c.window) : c.cached + c.added);
    }
    const AttentionBatch batch = backend.make_attention_batch(positions, query_start, seq_lens);
    const double kv_bytes = keys * kKvHeads * kDim * 2.0 * 2.0;
    const bool decode = c.added == 1;
    // Block tables over disjoint, shuffled parts of the pool, enough of them to defeat L2.
    const int64_t needed = c.batch * per_sequence;
    const int64_t rotations =
        std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kRotationBytes / (needed * block_bytes))), 1,
                            pool_blocks / needed);
    std::vector<int32_t> order(static_cast<std::size_t>(pool_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Tensor> tables;
    for (int64_t r = 0; r < rotations; ++r)
      tables.push_back(backend.upload_i32(
          std::vector<int32_t>(order.begin() + r * needed, order.begin() + (r + 1) * needed), {c.batch, per_sequence}));
    const Tensor q = backend.random_weight(DType::F32, {rows, kHeads * kDim}, options.seed + 2, 0.0f, 1.0f);
    Tensor out = backend.alloc(DType::F32, {rows, kHeads * kDim});
    AttentionParams params;
    params.num_heads = kHeads;
    params.num_kv_heads = kKvHeads;
    params.head_dim = kDim;
    params.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    params.sliding_window = c.window;

    int64_t call = 0;
    auto attend = [&] {
      backend.paged_attention(q, pool, tables[static_cast<std::size_t>(call++ % rotations)], batch, params, out);
    };
    for (int64_t i = 0; i < std::max<int64_t>(3, rotations); ++i) attend();
    std::vector<double> samples;
    for (int64_t i = 0; i < options.iterations; ++i) {
      check(cudaEventRecord(marks[0], backend.stream()), "cudaEventRecord");
      for (int64_t r = 0; r < options.repeats; ++r) attend();
      check(cudaEventRecord(marks[1], backend.stream()), "cudaEventRecord");
      check(cudaEventSynchronize(marks[1]), "cudaEventSynchronize");
      float elapsed = 0.0f;
      check(cudaEventElapsedTime(&elapsed, marks[0], marks[1]), "cudaEventElapsedTime");
      samples.push_back(static_cast<double>(elapsed) / static_cast<double>(options.repeats));
    }
    const std::vector<float> result = backend.download_f32(out);
    require(std::all_of(result.begin(), result.end(), [](float v) { return std::isfinite(v); }),
            "bench-attention: {} produced a non-finite output", c.name);
    const double ms = median(samples);
    if (decode) {
      const double floor_ms = kv_bytes / kHbmBytesPerSecond * 1e3;
      std::printf("| %s | %.4f | %.1f MB | %.2f TB/s | %.4f | %.0f%% |\n", c.name.c_str(), ms, kv_bytes / 1e6,
                  kv_bytes / (ms * 1e-3) / 1e12, floor_ms, 100.0 * floor_ms / ms);
    } else {
      const double flops = 4.0 * kDim * kHeads * pairs;
      const double floor_ms = flops / kBf16FlopsPerSecond * 1e3;
      std::printf("| %s | %.3f | %.1f GFLOP | %.1f TFLOP/s | %.3f | %.1f%% |\n", c.name.c_str(), ms, flops / 1e9,
                  flops / (ms * 1e-3) / 1e12, floor_ms, 100.0 * floor_ms / ms);
    }
    std::fflush(stdout);
  }
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
  std::printf("\ncompute dtype %s; median of %lld samples of %lld back-to-back calls each; decode floors count K and "
              "V bytes read, prefill floors 4 x head_dim FLOPs per (query head, visible key) at dense BF16 GEMM "
              "speed\n",
              options.dtype.c_str(), static_cast<long long>(options.iterations),
              static_cast<long long>(options.repeats));
}
#else
void run_bench(const BenchOptions&) {
  fail("bench-attention needs the CUDA backend: configure with -DBEAMLINE_CUDA=ON");
}
#endif

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench-attention",
      "Time paged attention (decode and prefill, Beam-1.0 shapes, BF16 KV) on the GPU next to the HBM and "
      "tensor-core floors");
  command->add_option("--iterations", options->iterations, "timed samples per case (median reported)")
      ->capture_default_str();
  command->add_option("--repeats", options->repeats, "back-to-back calls per sample")->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random KV pool and queries")->capture_default_str();
  command->add_option("--filter", options->filter, "only the cases whose name contains this");
  command->add_option("--dtype", options->dtype,
                      "compute dtype: float32 (FP32-accurate split operands) or bfloat16 (one rounding)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  command->callback([options] { run_bench(*options); });
});

}  // namespace
}  // namespace beamline::cli
