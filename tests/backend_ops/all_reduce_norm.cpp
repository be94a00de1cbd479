// The fused tensor-parallel all-reduce + residual add + RMSNorm (Backend::all_reduce_add_rms_norm, issue 19) in both
// modes. Test: N = 2, 4, 8 ranks' partials as N buffers of one device, at Beam-1.0's shapes (H 5120, 1/16/64 rows)
// and odd ones, with and without the next sub-layer's norm, against the CPU at the F32 tolerance, and the CPU op
// against sum-then-add_rms_norm(_then_norm) bit for bit; on the CUDA backend also the cross-GPU handshake, the
// simulated ranks in one launch meeting through AllReduceSignal in device memory, three rounds (epochs 1-3): every
// rank's residual bit for bit rank 0's, and rank 0's against the CPU. Perf (`perf all_reduce_norm`): the fused kernel
// on one GPU per rank count and row count next to the unfused path's local part (a sum kernel, then
// add_rms_norm_then_norm), as CUDA graphs, each next to its byte floor at 4.8 TB/s. Neither measures NVLink: the
// partials are local (bench/results/2026-12-03-arnorm.md).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "op_families.h"
#include "perf.h"

#ifdef BEAMLINE_HAVE_CUDA
#include "backend/cuda/rows/all_reduce_norm.h"
#endif

namespace beamline::backend_ops {
namespace {

constexpr float kEps = 1e-6f;
constexpr float kScale = 0.098f;  // a residual scale of Beam's order

struct Case {
  int32_t ranks;
  int64_t rows, hidden;
};

std::vector<Tensor> device_side(const std::vector<Harness::Pair>& pairs) {
  std::vector<Tensor> tensors;
  for (const Harness::Pair& pair : pairs) tensors.push_back(pair.device);
  return tensors;
}

std::vector<Tensor> reference_side(const std::vector<Harness::Pair>& pairs) {
  std::vector<Tensor> tensors;
  for (const Harness::Pair& pair : pairs) tensors.push_back(pair.reference);
  return tensors;
}

// Each rank's partial of one case, on the host and on both backends (the scale of an o_proj output split over ranks).
struct Partials {
  std::vector<std::vector<float>> values;
  std::vector<Harness::Pair> tensors;
};

Partials random_partials(Harness& harness, const Case& c) {
  Partials partials;
  for (int32_t r = 0; r < c.ranks; ++r) {
    partials.values.push_back(harness.inputs().uniform(c.rows * c.hidden, 2.0f));
    partials.tensors.push_back(harness.f32(partials.values.back(), {c.rows, c.hidden}));
  }
  return partials;
}

// The reference's op is add_rms_norm_then_norm (add_rms_norm without a next norm) of the partials summed in rank
// order on the host, bit for bit: the contract the op promises, held on the CPU whatever the device under test.
void check_reference_contract(Harness& harness, const Case& c, const Partials& partials, const Tensor& weight,
                              const Tensor& next_weight) {
  const auto start = std::chrono::steady_clock::now();
  Backend& cpu = harness.reference();
  std::vector<float> sum = partials.values[0];
  for (std::size_t r = 1; r < partials.values.size(); ++r)
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += partials.values[r][i];
  const std::vector<float> initial = harness.inputs().uniform(c.rows * c.hidden);
  const Tensor y = cpu.upload_f32(sum, {c.rows, c.hidden});
  Tensor fused = cpu.upload_f32(initial, {c.rows, c.hidden}), composed = cpu.upload_f32(initial, {c.rows, c.hidden});
  Tensor fused_out = cpu.alloc(DType::F32, {c.rows, c.hidden});
  Tensor composed_out = cpu.alloc(DType::F32, {c.rows, c.hidden});
  Tensor none;
  cpu.all_reduce_add_rms_norm(reference_side(partials.tensors), fused, weight, kEps, kScale, none, none);
  cpu.add_rms_norm(composed, y, weight, kEps, kScale);
  bool same = cpu.download_f32(fused) == cpu.download_f32(composed);
  cpu.all_reduce_add_rms_norm(reference_side(partials.tensors), fused, weight, kEps, kScale, next_weight, fused_out);
  cpu.add_rms_norm_then_norm(composed, y, weight, kEps, kScale, next_weight, composed_out);
  same = same && cpu.download_f32(fused) == cpu.download_f32(composed) &&
         cpu.download_f32(fused_out) == cpu.download_f32(composed_out);
  harness.record_result({"all_reduce_add_rms_norm contract",
                         fmt::format("N {} T {} H {}: {} = sum, then add_rms_norm(_then_norm)", c.ranks, c.rows,
                                     c.hidden, cpu.name()),
                         same ? 0.0 : 1.0, 0.0, same ? "" : "not bit for bit", same, seconds_since(start)});
}

void test_case(Harness& harness, const Case& c) {
  const auto start = std::chrono::steady_clock::now();
  const std::string shape = fmt::format("N {} T {} H {}", c.ranks, c.rows, c.hidden);
  const Partials partials = random_partials(harness, c);
  const std::vector<Tensor> device_partials = device_side(partials.tensors),
                            reference_partials = reference_side(partials.tensors);
  auto weight = harness.random_weight(DType::BF16, {c.hidden}, 1.0f);
  auto next_weight = harness.random_weight(DType::BF16, {c.hidden}, 1.0f);
  check_reference_contract(harness, c, partials, weight.reference, next_weight.reference);
  auto residual = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
  Tensor none;
  harness.device().all_reduce_add_rms_norm(device_partials, residual.device, weight.device, kEps, kScale, none, none);
  harness.reference().all_reduce_add_rms_norm(reference_partials, residual.reference, weight.reference, kEps, kScale,
                                               none, none);
  harness.record("all_reduce_add_rms_norm", shape + " residual", residual, kF32Tolerance, seconds_since(start));

  auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
  harness.device().all_reduce_add_rms_norm(device_partials, residual.device, weight.device, kEps, kScale,
                                           next_weight.device, out.device);
  harness.reference().all_reduce_add_rms_norm(reference_partials, residual.reference, weight.reference, kEps, kScale,
                                              next_weight.reference, out.reference);
  harness.record("all_reduce_add_rms_norm", shape + " then norm: residual", residual, kF32Tolerance,
                 seconds_since(start));
  harness.record("all_reduce_add_rms_norm", shape + " then norm: next norm", out, kF32Tolerance, seconds_since(start));
}

#ifdef BEAMLINE_HAVE_CUDA
// The handshake on one device: the N ranks in one launch (AllReducePeers::local_ranks, N x T blocks, at most 64, all
// resident at once), meeting through N AllReduceSignal in device memory as N GPUs would over NVLink; each rank's
// residual and next norm its own rows of one tensor.
void test_handshake(Harness& harness, CudaBackend& device, const Case& c, int rounds) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Harness::Pair> partials = random_partials(harness, c).tensors;
  auto weight = harness.random_weight(DType::BF16, {c.hidden}, 1.0f);
  auto next_weight = harness.random_weight(DType::BF16, {c.hidden}, 1.0f);
  const std::vector<float> initial = harness.inputs().uniform(c.rows * c.hidden);
  Tensor reference_residual = harness.reference().upload_f32(initial, {c.rows, c.hidden});
  Tensor reference_out = harness.reference().alloc(DType::F32, {c.rows, c.hidden});
  std::vector<float> every_rank;
  for (int32_t r = 0; r < c.ranks; ++r) every_rank.insert(every_rank.end(), initial.begin(), initial.end());
  Tensor residuals = device.upload_f32(every_rank, {c.ranks * c.rows, c.hidden});
  Tensor outs = device.alloc(DType::F32, {c.ranks * c.rows, c.hidden});
  void* signal_memory = nullptr;
  const std::size_t signal_bytes = sizeof(cuda::AllReduceSignal) * static_cast<std::size_t>(c.ranks);
  check_cuda(cudaMalloc(&signal_memory, signal_bytes), "all_reduce_norm", "cudaMalloc of the signals");
  check_cuda(cudaMemset(signal_memory, 0, signal_bytes), "all_reduce_norm", "cudaMemset of the signals");
  cuda::AllReducePeers peers;
  peers.ranks = peers.local_ranks = c.ranks;
  for (int32_t r = 0; r < c.ranks; ++r) {
    peers.partial[r] = partials[static_cast<std::size_t>(r)].device.data<const float>();
    peers.signal[r] = static_cast<cuda::AllReduceSignal*>(signal_memory) + r;
  }
  device.synchronize();
  for (int round = 0; round < rounds; ++round) {
    check_cuda(cuda::all_reduce_add_rms_norm(peers, residuals.data<float>(), weight.device.raw(),
                                             next_weight.device.raw(), DType::BF16, kEps, kScale, c.rows, c.hidden,
                                             outs.data<float>(), device.stream()),
               "all_reduce_norm", "all_reduce_add_rms_norm launch");
    harness.reference().all_reduce_add_rms_norm(reference_side(partials), reference_residual, weight.reference, kEps,
                                                kScale, next_weight.reference, reference_out);
  }
  const std::vector<float> all_residuals = as_f32(device, residuals), all_outs = as_f32(device, outs);
  check_cuda(cudaFree(signal_memory), "all_reduce_norm", "cudaFree of the signals");

  const auto rank_rows = [&](const std::vector<float>& all, int32_t r) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(r * c.rows * c.hidden);
    return std::vector<float>(begin, begin + static_cast<std::ptrdiff_t>(c.rows * c.hidden));
  };
  const std::vector<float> rank0 = rank_rows(all_residuals, 0), rank0_out = rank_rows(all_outs, 0);
  int32_t differing = 0;
  for (int32_t r = 1; r < c.ranks; ++r)
    differing += rank_rows(all_residuals, r) != rank0 || rank_rows(all_outs, r) != rank0_out;
  const std::string shape = fmt::format("N {} T {} H {}, {} rounds", c.ranks, c.rows, c.hidden, rounds);
  harness.record_result({"all_reduce_add_rms_norm handshake", shape + ": ranks bit-identical", double(differing), 0.0,
                         fmt::format("{} of {} ranks differ from rank 0", differing, c.ranks - 1), differing == 0,
                         seconds_since(start)});
  const double error = std::max(relative_error(rank0, harness.reference().download_f32(reference_residual)),
                                relative_error(rank0_out, harness.reference().download_f32(reference_out)));
  harness.record_result({"all_reduce_add_rms_norm handshake", shape + ": rank 0 against the CPU", error,
                         kF32Tolerance, {}, error <= kF32Tolerance, seconds_since(start)});
}
#endif

}  // namespace

void test_all_reduce_norm(Harness& harness) {
  std::vector<Case> cases;
  for (const int32_t ranks : {2, 4, 8})
    for (const int64_t rows : {1L, 16L, 64L})
      if (!harness.small_only() || rows <= 16) cases.push_back({ranks, rows, 5120});
  for (const Case& odd : {Case{3, 7, 1000}, Case{1, 5, 67}, Case{8, 2, 8192}, Case{5, 3, 33}}) cases.push_back(odd);
  for (const Case& c : cases) test_case(harness, c);
#ifdef BEAMLINE_HAVE_CUDA
  if (auto* cuda_device = dynamic_cast<CudaBackend*>(&harness.device()))
    for (const Case& c : {Case{2, 1, 5120}, Case{4, 16, 5120}, Case{8, 8, 5120}, Case{3, 5, 1000}})
      test_handshake(harness, *cuda_device, c, 3);
#endif
}

// ---- perf ----

namespace {

struct PerfOptions {
  std::vector<int32_t> ranks{2, 4, 8};
  std::vector<int64_t> rows{1, 16, 64};
  int64_t hidden = 5120;
  int64_t iterations = 100;
};

#ifdef BEAMLINE_HAVE_CUDA
void run_perf(const PerfOptions& options) {
  require(options.iterations >= 1, "perf all_reduce_norm: --iterations must be >= 1");
  require(options.hidden >= 1 && options.hidden <= cuda::kAllReduceMaxHidden,
          "perf all_reduce_norm: --hidden {} outside [1, {}]", options.hidden, cuda::kAllReduceMaxHidden);
  CudaBackend backend;
  const int64_t hidden = options.hidden;
  uint64_t seed = 1;
  const Tensor weight = backend.random_weight(DType::BF16, {hidden}, seed++, 1.0f, 0.1f);
  const Tensor next_weight = backend.random_weight(DType::BF16, {hidden}, seed++, 1.0f, 0.1f);
  spdlog::info("perf all_reduce_norm: H {} on {}; the N partials are local buffers (no NVLink)", hidden,
               backend.device_description());
  std::printf("\n| ranks | rows | fused floor µs | fused µs | unfused floor µs | sum µs | add_rms_norm_then_norm µs | "
              "unfused µs | fused / unfused |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int32_t ranks : options.ranks) {
    require(ranks >= 1 && ranks <= cuda::kAllReduceMaxRanks, "perf all_reduce_norm: --ranks {} outside [1, {}]",
            ranks, cuda::kAllReduceMaxRanks);
    for (const int64_t rows : options.rows) {
      require(rows >= 1, "perf all_reduce_norm: --rows must be >= 1");
      std::vector<Tensor> partials;
      cuda::AllReducePeers peers;
      peers.ranks = ranks;
      for (int32_t r = 0; r < ranks; ++r) {
        partials.push_back(backend.random_weight(DType::F32, {rows, hidden}, seed++, 0.0f, 1.0f));
        peers.partial[r] = partials.back().data<const float>();
      }
      Tensor residual = backend.random_weight(DType::F32, {rows, hidden}, seed++, 0.0f, 1.0f);
      Tensor y = backend.alloc(DType::F32, {rows, hidden}), out = backend.alloc(DType::F32, {rows, hidden});
      const auto sum = [&] {
        check_cuda(cuda::sum_partials(peers, rows * hidden, y.data<float>(), backend.stream()), "all_reduce_norm",
                   "sum_partials");
      };
      const auto norm = [&] { backend.add_rms_norm_then_norm(residual, y, weight, 1e-6f, kScale, next_weight, out); };
      const auto fused = [&] {
        backend.all_reduce_add_rms_norm(partials, residual, weight, 1e-6f, kScale, next_weight, out);
      };
      const double fused_ms = time_graph(backend, fused, options.iterations, "all_reduce_norm");
      const double sum_ms = time_graph(backend, sum, options.iterations, "all_reduce_norm");
      const double norm_ms = time_graph(backend, norm, options.iterations, "all_reduce_norm");
      const double unfused_ms = time_graph(
          backend, [&] { sum(), norm(); }, options.iterations, "all_reduce_norm");
      // Bytes each path must move at least: the partials read, the residual read and written, the next norm written,
      // the weights (BF16) read; the unfused path also writes the sum and reads it back.
      const double row_bytes = 4.0 * static_cast<double>(rows * hidden);
      const double fused_bytes = (ranks + 3) * row_bytes + 2.0 * 2.0 * static_cast<double>(hidden);
      const double unfused_bytes = fused_bytes + 2.0 * row_bytes;
      std::printf("| %d | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", ranks,
                  static_cast<long long>(rows), fused_bytes / kHbmBytesPerSecond * 1e6, fused_ms * 1e3,
                  unfused_bytes / kHbmBytesPerSecond * 1e6, sum_ms * 1e3, norm_ms * 1e3, unfused_ms * 1e3,
                  fused_ms / unfused_ms);
    }
  }
}
#endif

}  // namespace

void add_all_reduce_norm_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "all_reduce_norm", "Time the fused all-reduce + residual add + RMSNorm on one GPU (N ranks' partials as local "
                         "buffers) next to the unfused local part (sum kernel, then add_rms_norm_then_norm), as CUDA "
                         "graphs, next to the byte floor at 4.8 TB/s");
  command->add_option("--ranks", options->ranks, "simulated ranks (partials)")->delimiter(',')->capture_default_str();
  command->add_option("--rows", options->rows, "rows (decode batch)")->delimiter(',')->capture_default_str();
  command->add_option("--hidden", options->hidden, "row width (Beam-1.0: 5120)")->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays per case (median reported)")
      ->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("all_reduce_norm");
#endif
  });
}

}  // namespace beamline::backend_ops
