// The router and the experts in both modes. Test: route (Beam-1.0's group-limited top-k, odd widths, exact ties:
// ids exact, weights at the F32 tolerance) and moe (Beam-1.0's widths, odd ones, and routings chosen to hit the
// CUDA kernels' tile edges and idle experts). Perf (`perf moe`): one MoE layer of a preset (the FP32 router with its
// group-limited top-k, and the experts) on the CUDA backend per token count, with random weights drawn on the
// device, replayed as a CUDA graph as the decode loop runs it; prints a Markdown table next to the HBM floor (the
// bytes of the router and of every expert the routing touched, read once, / 4.8 TB/s; PERF.md), for each compute
// dtype asked (--dtype: float32 = FP32-accurate split operands on the tensor cores, bfloat16 = one BF16 rounding,
// vLLM's precision). The router alone is timed as a graph of its own next to the bytes of its FP32 matrix / 4.8
// TB/s (replayed back to back, the 5.2 MB matrix stays in L2, where in the layer the expert stream evicts it).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "harness.h"
#include "model/beam_model.h"
#include "op_families.h"
#include "perf.h"

namespace beamline::backend_ops {

// The picks of the device against the reference's, row by row: a different id is a different expert, not a rounding.
void record_route_ids(Harness& harness, const Harness::Pair& ids, int64_t rows, int32_t top_k, const std::string& shape,
                      std::chrono::steady_clock::time_point start) {
  const std::vector<int32_t> device_ids = harness.device().download_i32(ids.device);
  const std::vector<int32_t> reference_ids = harness.reference().download_i32(ids.reference);
  int64_t mismatched = 0;
  for (int64_t r = 0; r < rows; ++r)
    mismatched += !std::equal(device_ids.begin() + r * top_k, device_ids.begin() + (r + 1) * top_k,
                              reference_ids.begin() + r * top_k);
  Result result{"route ids", shape, static_cast<double>(mismatched), 0.0,
                fmt::format("{} of {} rows differ", mismatched, rows), mismatched == 0, seconds_since(start)};
  harness.record_result(std::move(result));
}

// The sandwich norm after attention, the MoE's input norm and the router as one op: on cuda one launch for one row with
// BF16/F16 norm weights (the norms folded into the router's blocks), the two ops otherwise (F32 weights, more rows,
// rows that are not a multiple of 4).
void test_add_rms_norm_then_route(Harness& harness) {
  struct Case {
    int64_t rows, hidden;
    int32_t experts;
    RouterParams params;
    DType norm_dtype;
    const char* what;
  };
  const std::vector<Case> cases{{1, 5120, 256, {8, 4, 8, true, 2.5f}, DType::BF16, "beam-1.0 decode: folded"},
                                {1, 5120, 256, {8, 4, 8, true, 2.5f}, DType::F16, "F16 norms: folded"},
                                {1, 8192, 64, {4, 2, 6, false, 1.0f}, DType::BF16, "H 8192: folded, widest row"},
                                {1, 96, 24, {3, 2, 5, false, 1.0f}, DType::BF16, "odd: folded"},
                                {1, 5120, 256, {8, 4, 8, true, 2.5f}, DType::F32, "F32 norms: two ops"},
                                {1, 98, 16, {4, 2, 3, true, 1.0f}, DType::BF16, "H not a multiple of 4: two ops"},
                                {1, 9000, 32, {4, 2, 4, true, 1.0f}, DType::BF16, "H 9000: two ops"},
                                {5, 5120, 256, {8, 4, 8, true, 2.5f}, DType::BF16, "5 rows: two ops"}};
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    const std::string shape = fmt::format("T {} H {} E {} groups {}/{} top {} {} ({})", c.rows, c.hidden, c.experts,
                                          c.params.n_group, c.params.topk_group, c.params.top_k,
                                          dtype_name(c.norm_dtype), c.what);
    auto weight = harness.random_weight(c.norm_dtype, {c.hidden}, 1.0f);
    auto next_weight = harness.random_weight(c.norm_dtype, {c.hidden}, 1.0f);
    auto y = harness.f32(harness.inputs().uniform(c.rows * c.hidden, 3.0f), {c.rows, c.hidden});
    auto residual = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto router = harness.f32(harness.inputs().uniform(int64_t{c.experts} * c.hidden, 0.05f), {c.experts, c.hidden});
    auto bias = harness.f32(harness.inputs().uniform(c.experts, 0.01f), {c.experts});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    auto ids = harness.poisoned(DType::I32, {c.rows, c.params.top_k});
    auto weights = harness.poisoned(DType::F32, {c.rows, c.params.top_k});
    // Twice on the device (the second launch must find the arrival count back at 0), once on the reference.
    for (int round = 0; round < 2; ++round) {
      if (round == 1)  // the residual as it was (the reference's is still untouched)
        harness.device().copy_to(residual.device, harness.reference().download_f32(residual.reference).data());
      harness.device().add_rms_norm_then_route(residual.device, y.device, weight.device, 1e-6f, 0.098f,
                                               next_weight.device, out.device, router.device, bias.device, c.params,
                                               ids.device, weights.device);
    }
    harness.reference().add_rms_norm_then_route(residual.reference, y.reference, weight.reference, 1e-6f, 0.098f,
                                                 next_weight.reference, out.reference, router.reference,
                                                 bias.reference, c.params, ids.reference, weights.reference);
    harness.record("add_rms_norm_then_route residual", shape, residual, kF32Tolerance, seconds_since(start));
    harness.record("add_rms_norm_then_route norm", shape, out, kF32Tolerance, seconds_since(start));
    record_route_ids(harness, ids, c.rows, c.params.top_k, shape, start);
    harness.record("add_rms_norm_then_route weights", shape, weights, kF32Tolerance, seconds_since(start));
  }
}

void test_route(Harness& harness) {
  struct Case {
    int64_t rows, hidden;
    int32_t experts;
    RouterParams params;
    bool ties;
    const char* what;
  };
  const std::vector<Case> cases{{1, 5120, 256, {8, 4, 8, true, 2.5f}, false, "beam-1.0 decode"},
                                {5, 5120, 256, {8, 4, 8, true, 2.5f}, true, "beam-1.0 decode, 5 rows, exact ties"},
                                {3, 98, 16, {4, 2, 3, true, 1.0f}, false, "decode rows, hidden not a multiple of 4"},
                                {8, 5120, 256, {8, 4, 8, true, 2.5f}, true, "8 rows: the most of one fused launch"},
                                {9, 5120, 256, {8, 4, 8, true, 2.5f}, false, "9 rows: router GEMM, then the top-k"},
                                {2, 256, 1024, {8, 4, 8, false, 1.5f}, true, "fused, 1024 experts (2 routing warps)"},
                                {4, 64, 32, {1, 1, 1, true, 1.0f}, false, "fused, one group, top 1"},
                                {64, 5120, 256, {8, 4, 8, true, 2.5f}, false, "beam-1.0"},
                                {33, 64, 8, {4, 2, 2, true, 2.5f}, false, "tiny"},
                                {17, 96, 24, {3, 2, 5, false, 1.0f}, false, "odd, unnormalised"},
                                {40, 128, 64, {8, 3, 6, true, 2.5f}, true, "exact ties"}};
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> router = harness.inputs().uniform(int64_t{c.experts} * c.hidden, 0.05f);
    std::vector<float> bias = harness.inputs().uniform(c.experts, 0.01f);
    if (c.ties)  // experts 2i and 2i+1 identical: every choice between them is a tie, the lower index must win
      for (int32_t e = 1; e < c.experts; e += 2) {
        std::copy_n(router.begin() + (e - 1) * c.hidden, c.hidden, router.begin() + e * c.hidden);
        bias[static_cast<std::size_t>(e)] = bias[static_cast<std::size_t>(e - 1)];
      }
    auto router_tensor = harness.f32(router, {c.experts, c.hidden});
    auto bias_tensor = harness.f32(bias, {c.experts});
    auto h = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto ids = harness.poisoned(DType::I32, {c.rows, c.params.top_k});
    auto weights = harness.poisoned(DType::F32, {c.rows, c.params.top_k});
    harness.device().route(h.device, router_tensor.device, bias_tensor.device, c.params, ids.device, weights.device);
    harness.reference().route(h.reference, router_tensor.reference, bias_tensor.reference, c.params, ids.reference,
                              weights.reference);
    const std::string shape = fmt::format("T {} E {} H {} groups {}/{} top {} ({})", c.rows, c.experts, c.hidden,
                                          c.params.n_group, c.params.topk_group, c.params.top_k, c.what);
    record_route_ids(harness, ids, c.rows, c.params.top_k, shape, start);
    harness.record("route weights", shape, weights, kF32Tolerance, seconds_since(start));
  }
  test_add_rms_norm_then_route(harness);
}


void test_moe(Harness& harness) {
  struct Case {
    int64_t rows, hidden, intermediate;
    int32_t experts, top_k, distinct;
    const char* what;
    std::vector<int32_t> counts = {};  // slots per expert; empty: random distinct experts per token
  };
  std::vector<Case> cases{
      {1, 5120, 2560, 256, 8, 31, "beam-1.0 decode: one token"},
      {64, 5120, 2560, 256, 8, 31, "beam-1.0"},
      {300, 5120, 2560, 256, 8, 31, "beam-1.0 prefill"},
      {208, 5120, 2560, 256, 8, 31, "beam-1.0, tokens per expert 200/65/64/9/8/7/1, most experts idle",
       sparse_counts(256, {{3, 200}, {17, 65}, {42, 64}, {100, 9}, {101, 8}, {200, 7}, {255, 1}, {128, 1}, {5, 187},
                           {6, 187}, {7, 187}, {8, 187}, {9, 187}, {10, 187}, {11, 187}})},
      {1, 64, 32, 8, 2, 8, "tiny, one token"},
      {2, 64, 32, 8, 2, 8, "tiny, two tokens: the fewest on the tensor cores"},
      {33, 64, 32, 8, 2, 8, "tiny"},
      {70, 200, 72, 12, 3, 12, "odd"},
      {242, 200, 72, 10, 2, 10, "odd, tokens per expert 1/7/8/9/0/64/65/200/0/130",
       {1, 7, 8, 9, 0, 64, 65, 200, 0, 130}},
      {60, 200, 72, 64, 2, 16, "odd, few tokens per expert (16-token tiles): 1/7/8/9/16/17/22/40, most idle",
       sparse_counts(64, {{0, 1}, {5, 7}, {9, 8}, {20, 9}, {33, 16}, {40, 17}, {50, 22}, {63, 40}})},
      {64, 200, 72, 64, 2, 16, "odd, few tokens per expert (bfloat16: wgmma chunks of 16): 64/40/24, most idle",
       sparse_counts(64, {{3, 64}, {10, 40}, {20, 24}})},
      {600, 200, 72, 10, 2, 10,
       "odd, many tokens per expert (bfloat16: wgmma tiles of 128): 0/1/63/64/65/127/128/129/300/323",
       {0, 1, 63, 64, 65, 127, 128, 129, 300, 323}},
      {40, 60, 36, 6, 2, 6, "H not a multiple of 8: grouped GEMM"},
      {256, 256, 128, 8, 8, 8, "every token on every expert: four full tiles each"},
      {1100, 64, 32, 8, 2, 8, "tiny, 1100 tokens: many tiles per expert"},
      // One token on the staged kernels (quant/staged_moe.cuh) unless BEAMLINE_CUDA_TOKEN_MOE names a previous
      // version: H 200 is 1.25 down blocks of 160 rows and 6.25 tiles of 32, I 72 a 64-wide stage and a cut one; top 1
      // combines at the first arrival.
      {1, 200, 72, 12, 3, 12, "odd, one token"},
      {1, 64, 32, 8, 1, 8, "tiny, one token, top 1"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 4);
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    auto [device_moe, reference_moe] = random_experts(harness, c.experts, c.distinct, c.hidden, c.intermediate);
    auto [id_values, weight_values] = random_assignment(harness.inputs(), c.rows, c.experts, c.top_k);
    if (!c.counts.empty()) id_values = assignment_with_counts(harness.inputs(), c.counts, c.rows, c.top_k);
    auto ids = harness.i32(id_values, {c.rows, c.top_k});
    auto weights = harness.f32(weight_values, {c.rows, c.top_k});
    auto h = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    harness.device().moe(h.device, ids.device, weights.device, device_moe, out.device);
    harness.reference().moe(h.reference, ids.reference, weights.reference, reference_moe, out.reference);
    harness.record("moe", fmt::format("T {} H {} E {}x{} top {} ({})", c.rows, c.hidden, c.experts, c.intermediate,
                                      c.top_k, c.what),
                   out, harness.operand_tolerance(), seconds_since(start));
  }
  // Float32 only: gate and up sums that lie in the tokens' low bits (Inputs::low_bit_pairs against pair-sign gate and
  // up), exact in FP32 in any order, so the split operands must carry all 19 bits of h (three BF16 terms do; two
  // fail by ~1e-3): 16-token and 64-token tiles on the tensor cores, the grouped GEMM (H not a multiple of 8), and
  // one token (three BF16 terms on the staged kernels, or streamed in F32).
  if (harness.device().compute_dtype() != ComputeDType::Float32) return;
  struct LowBitCase {
    int64_t rows, hidden, intermediate;
    const char* what;
  };
  for (const LowBitCase& c : {LowBitCase{2, 32, 64, "16-token tiles"}, LowBitCase{300, 32, 64, "64-token tiles"},
                              LowBitCase{40, 30, 36, "grouped GEMM"}, LowBitCase{1, 32, 64, "one token"}}) {
    const auto start = std::chrono::steady_clock::now();
    const int32_t experts = 8, top_k = 2;
    auto [device_moe, reference_moe] = low_bit_experts(harness, experts, c.hidden, c.intermediate);
    auto [id_values, weight_values] = random_assignment(harness.inputs(), c.rows, experts, top_k);
    auto ids = harness.i32(id_values, {c.rows, top_k});
    auto weights = harness.f32(weight_values, {c.rows, top_k});
    auto h = harness.f32(harness.inputs().low_bit_pairs(c.rows, c.hidden), {c.rows, c.hidden});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    harness.device().moe(h.device, ids.device, weights.device, device_moe, out.device);
    harness.reference().moe(h.reference, ids.reference, weights.reference, reference_moe, out.reference);
    harness.record("moe", fmt::format("T {} H {} E {}x{} top {} (low bits: the split's third term, {})", c.rows,
                                      c.hidden, experts, c.intermediate, top_k, c.what),
                   out, kLowBitsTolerance, seconds_since(start));
  }
}


// ---- perf ----

namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> tokens{1, 16, 64, 256, 1024};
  std::vector<std::string> dtypes{"float32", "bfloat16"};
  int64_t iterations = 50;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA

// One row of the table: the layer for `tokens` tokens of activations drawn from `h_seed`.
void bench_tokens(CudaBackend& backend, const MoeTensors& moe, const RouterParams& router, const std::string& dtype,
                  int64_t tokens, uint64_t h_seed, const PerfOptions& options) {
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

  const double eager_ms = time_back_to_back(backend, layer, options.iterations, "moe");

  const double graph_ms = time_graph(backend, layer, options.iterations, "moe");
  // The router alone (its logits and the group-limited top-k), the layer's fixed cost at few tokens.
  const double route_ms = time_graph(
      backend, [&] { backend.route(h, moe.router, moe.router_bias, router, ids, weights); }, options.iterations, "moe");

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

void run_perf(const PerfOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(config.n_routed_experts > 0, "perf moe: preset {} has no MoE layers", options.preset);
  require(options.iterations >= 1, "perf moe: --iterations must be >= 1");
  for (const int64_t tokens : options.tokens) require(tokens >= 1, "perf moe: --tokens must be >= 1");
  CudaBackend backend;
  uint64_t seed = options.seed;
  // Near-zero router logits and no bias make the routing close to uniform over the experts, as in PERF.md's
  // measurements (16 tokens touch about 100 experts, 64 about 218, 256 nearly all), so the rows compare.
  const MoeTensors moe = random_moe_layer(backend, config, seed, 1e-3f, 0.0f);
  const RouterParams router = router_params(config);
  spdlog::info("perf moe: {} MoE layer ({} experts x {}x{}, top {}) on {}", options.preset, config.n_routed_experts,
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
#endif

}  // namespace

void add_moe_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "moe", "Time one MoE layer (router + experts) of a preset on the GPU with random on-device weights, per "
                   "token count, as a CUDA graph, next to the HBM floor");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--tokens", options->tokens, "token counts")->delimiter(',')->capture_default_str();
  command->add_option("--dtype", options->dtypes, "compute dtypes, each a table section (float32, bfloat16)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed runs per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("moe");
#endif
  });
}

}  // namespace beamline::backend_ops
