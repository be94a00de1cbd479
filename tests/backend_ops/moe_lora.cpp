// MoE LoRA (Backend::moe_lora) in test mode, against the reference, and in perf mode next to the plain MoE: each
// token's adapter slot (or none) applied inside every routed expert, the adapters at their true ranks (docs/lora.md).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "harness.h"
#include "model/beam_model.h"
#include "model/lora_table.h"
#include "op_families.h"
#include "perf.h"

namespace beamline::backend_ops {
namespace {

// A random adapter module of `rank` for [in -> out], its B already scaled (small, so the deltas stay a perturbation
// of the expert's output that still moves it well past the tolerance).
LoraModule random_module(Inputs& inputs, LoraProjection projection, int64_t rank, int64_t in, int64_t out) {
  LoraModule module;
  module.projection = projection;
  module.rank = rank;
  module.in = in;
  module.out = out;
  module.a = inputs.uniform(rank * in, 1.0f / std::sqrt(static_cast<float>(in)));
  module.b = inputs.uniform(out * rank, 0.5f / std::sqrt(static_cast<float>(rank)));
  return module;
}

// `module` zero-padded to `rank` (A's rows and B's columns past its own rank are zeros): the same delta, as an
// adapter stored at a padded rank computes it.
LoraModule padded_module(const LoraModule& module, int64_t rank) {
  LoraModule padded = module;
  padded.rank = rank;
  padded.a.assign(static_cast<std::size_t>(rank * module.in), 0.0f);
  padded.b.assign(static_cast<std::size_t>(module.out * rank), 0.0f);
  std::copy(module.a.begin(), module.a.end(), padded.a.begin());
  for (int64_t o = 0; o < module.out; ++o)
    for (int64_t r = 0; r < module.rank; ++r)
      padded.b[static_cast<std::size_t>(o * rank + r)] = module.b[static_cast<std::size_t>(o * module.rank + r)];
  return padded;
}

// Each token's slot: every fifth token none (-1), the others one of `slots` in turn.
std::vector<int32_t> token_slots(int64_t rows, int32_t slots) {
  std::vector<int32_t> values(static_cast<std::size_t>(rows));
  for (std::size_t t = 0; t < values.size(); ++t)
    values[t] = t % 5 == 4 ? -1 : static_cast<int32_t>(t % static_cast<std::size_t>(slots));
  return values;
}

}  // namespace

void test_moe_lora(Harness& harness) {
  struct Case {
    int64_t rows, hidden, intermediate;
    int32_t experts, top_k, slots;
    std::vector<int64_t> ranks;  // expert e of slot s takes ranks[(s * experts + e) % size]; 0: not adapted
    bool gate = true, up = true, down = true;
    int32_t distinct = 0;  // > 0: experts (and adapters) reused cyclically to bound host memory
    const char* what = "";
    int64_t padded = 0;  // > 0: the device's tables hold every module zero-padded to this rank, the reference's not
    DType dtype = DType::BF16;  // of the experts
  };
  std::vector<Case> cases{
      {1, 5120, 2560, 256, 8, 1, {8}, true, true, true, 31, "beam-1.0 decode, r/top_k = 8"},
      {16, 5120, 2560, 256, 8, 4, {8}, true, true, true, 31, "beam-1.0, 4 adapters"},
      {64, 5120, 2560, 256, 8, 8, {8, 8, 8, 0}, true, true, true, 31, "beam-1.0 batch 64, 8 adapters, some experts not adapted"},
      {16, 5120, 2560, 256, 8, 2, {8}, true, true, true, 31, "beam-1.0, r/top_k = 8 padded to r = 64 on the device", 64},
      {1, 64, 32, 8, 2, 1, {4}, true, true, true, 0, "tiny, one token"},
      {37, 200, 72, 12, 3, 3, {1, 3, 0, 8, 5, 33, 2}, true, true, true, 0, "odd, ranks 0-33 differing per expert"},
      {40, 60, 36, 6, 2, 2, {7, 2}, true, true, true, 0, "H not a multiple of 8"},
      {23, 64, 48, 8, 2, 2, {4, 9}, false, false, true, 0, "down only"},
      {19, 64, 48, 8, 2, 2, {3}, true, false, false, 0, "gate only"},
      {70, 64, 32, 8, 8, 2, {2, 6}, true, true, true, 0, "every token on every expert: 9 tiles of 8 per expert"},
      {5, 64, 128, 1, 1, 3, {8, 16, 4}, true, true, true, 0, "a dense MLP as one expert of weight 1"},
      {21, 64, 48, 8, 4, 3, {3, 5, 0}, true, true, true, 0, "ranks 3 and 5 padded to 16 on the device", 16},
      {1, 200, 72, 12, 3, 2, {5, 0}, true, true, true, 0, "one token, odd widths, ranks padded to 8 on the device", 8},
      {12, 64, 48, 8, 2, 2, {4, 7}, true, true, true, 0, "F16 experts: the streaming kernels of several tokens", 0,
       DType::F16}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 4);
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    const int32_t distinct = c.distinct > 0 ? c.distinct : c.experts;
    auto [device_moe, reference_moe] = random_experts(harness, c.experts, distinct, c.hidden, c.intermediate, c.dtype);

    // The adapters of each projection: one table per backend, entry s * experts + e at its own rank.
    std::vector<std::unique_ptr<LoraTableStore>> stores;
    SwigluLora device_lora, reference_lora;
    const bool adapted[] = {c.gate, c.up, c.down};
    LoraTable* device_tables[] = {&device_lora.gate, &device_lora.up, &device_lora.down};
    LoraTable* reference_tables[] = {&reference_lora.gate, &reference_lora.up, &reference_lora.down};
    for (int p = 0; p < 3; ++p) {
      if (!adapted[p]) continue;
      const int64_t in = p == 2 ? c.intermediate : c.hidden, out = p == 2 ? c.hidden : c.intermediate;
      const LoraProjection projection = kLoraProjections[4 + p];
      // distinct * slots modules at most, reused cyclically over the experts.
      std::vector<LoraModule> modules, device_modules;
      for (int64_t i = 0; i < int64_t{distinct} * c.slots; ++i) {
        const int64_t rank = c.ranks[static_cast<std::size_t>(i) % c.ranks.size()];
        modules.push_back(rank > 0 ? random_module(harness.inputs(), projection, rank, in, out) : LoraModule{});
        if (c.padded > 0) device_modules.push_back(rank > 0 ? padded_module(modules.back(), c.padded) : LoraModule{});
      }
      for (Backend* backend : {&harness.device(), &harness.reference()}) {
        const std::vector<LoraModule>& stored = backend == &harness.device() && c.padded > 0 ? device_modules : modules;
        stores.push_back(std::make_unique<LoraTableStore>(*backend, c.slots, c.experts, in, out));
        for (int32_t slot = 0; slot < c.slots; ++slot) {
          std::vector<const LoraModule*> by_expert;
          for (int32_t e = 0; e < c.experts; ++e) {
            const LoraModule& module = stored[static_cast<std::size_t>(slot * distinct + e % distinct)];
            by_expert.push_back(module.rank > 0 ? &module : nullptr);
          }
          stores.back()->load(slot, by_expert);
        }
      }
      *device_tables[p] = stores[stores.size() - 2]->table();
      *reference_tables[p] = stores.back()->table();
    }
    auto [id_values, weight_values] = random_assignment(harness.inputs(), c.rows, c.experts, c.top_k);
    if (c.experts == 1) weight_values.assign(weight_values.size(), 1.0f);
    auto ids = harness.i32(id_values, {c.rows, c.top_k});
    auto weights = harness.f32(weight_values, {c.rows, c.top_k});
    const std::vector<int32_t> slot_values = token_slots(c.rows, c.slots);
    auto slots = harness.i32(slot_values, {c.rows});
    device_lora.row_adapters = slots.device;
    reference_lora.row_adapters = slots.reference;
    auto h = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    harness.device().moe_lora(h.device, ids.device, weights.device, device_moe, device_lora, out.device);
    harness.reference().moe_lora(h.reference, ids.reference, weights.reference, reference_moe, reference_lora,
                                 out.reference);
    std::string ranks;
    for (const int64_t rank : c.ranks) ranks += fmt::format("{}{}", ranks.empty() ? "" : "/", rank);
    const std::string shape =
        fmt::format("T {} H {} I {} E {} top {} slots {} r {}{}{}{}{} {}: {}", c.rows, c.hidden, c.intermediate,
                    c.experts, c.top_k, c.slots, ranks, c.padded > 0 ? fmt::format(" (device {})", c.padded) : "",
                    c.gate ? " gate" : "", c.up ? " up" : "", c.down ? " down" : "", dtype_name(c.dtype), c.what);
    // The base experts run moe's kernels (docs/lora.md), so moe's tolerance: exact F32 where the weights stream
    // through the CUDA cores (one token; F16 experts, which the tensor-core kernels do not take, up to
    // kMaxStreamingAssignments slots), the operand precision of the tensor cores otherwise.
    const bool streamed = (c.rows == 1 || c.dtype == DType::F16) && c.hidden % 8 == 0 && c.intermediate % 8 == 0;
    harness.record("moe_lora", shape, out, streamed ? kF32Tolerance : harness.operand_tolerance(),
                   seconds_since(start));
    // Rows without an adapter go through the same kernels with zero deltas: moe's output bit for bit.
    if (std::find(slot_values.begin(), slot_values.end(), -1) == slot_values.end()) continue;
    Tensor plain = harness.device().alloc(DType::F32, {c.rows, c.hidden});
    harness.device().moe(h.device, ids.device, weights.device, device_moe, plain);
    const std::vector<float> with_lora = as_f32(harness.device(), out.device);
    const std::vector<float> without = as_f32(harness.device(), plain);
    int64_t differing = 0;
    for (int64_t t = 0; t < c.rows; ++t) {
      if (slot_values[static_cast<std::size_t>(t)] >= 0) continue;
      for (int64_t i = t * c.hidden; i < (t + 1) * c.hidden; ++i)
        differing += with_lora[static_cast<std::size_t>(i)] != without[static_cast<std::size_t>(i)] ? 1 : 0;
    }
    harness.record_result({"moe_lora", shape + ", rows without an adapter against moe",
                           static_cast<double>(differing), 0.0,
                           fmt::format("bit for bit: {} values differ", differing), differing == 0,
                           seconds_since(start)});
  }
}

namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> tokens{1, 16, 64};
  int32_t adapters = 8;
  int64_t rank = 64;  // the adapter's r; experts at r / top_k (true rank) against r (padded)
  int64_t iterations = 50;
  uint64_t seed = 1;
  std::string dtype = "float32";  // --dtype: the tensor-core operand precision of moe's kernels (float32: split)
};

#ifdef BEAMLINE_HAVE_CUDA
// Every expert of every slot adapted on gate, up and down at `rank`, drawn on the host once and shared by the
// experts (the timing reads each entry's own copy: the table holds slots x experts of them).
std::vector<std::unique_ptr<LoraTableStore>> expert_tables(CudaBackend& backend, const ModelConfig& config,
                                                           int32_t slots, int64_t rank, Inputs& inputs,
                                                           SwigluLora& lora) {
  std::vector<std::unique_ptr<LoraTableStore>> stores;
  const int64_t hidden = config.hidden_size, intermediate = config.moe_intermediate_size;
  LoraTable* tables[] = {&lora.gate, &lora.up, &lora.down};
  for (int p = 0; p < 3; ++p) {
    const int64_t in = p == 2 ? intermediate : hidden, out = p == 2 ? hidden : intermediate;
    const LoraModule module = random_module(inputs, kLoraProjections[4 + p], rank, in, out);
    stores.push_back(std::make_unique<LoraTableStore>(backend, slots, config.n_routed_experts, in, out));
    const std::vector<const LoraModule*> by_expert(static_cast<std::size_t>(config.n_routed_experts), &module);
    for (int32_t slot = 0; slot < slots; ++slot) stores.back()->load(slot, by_expert);
    *tables[p] = stores.back()->table();
  }
  return stores;
}

void run_perf(const PerfOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(config.n_routed_experts > 0, "perf moe_lora: preset {} has no MoE layers", options.preset);
  require(options.rank % config.num_experts_per_tok == 0, "perf moe_lora: --rank {} is not a multiple of top_k {}",
          options.rank, config.num_experts_per_tok);
  CudaBackend backend;
  backend.set_compute_dtype(parse_compute_dtype(options.dtype, backend.device()));
  uint64_t seed = options.seed;
  const MoeTensors moe = random_moe_layer(backend, config, seed, 1e-3f, 0.0f);
  const RouterParams router = router_params(config);
  const int64_t true_rank = options.rank / config.num_experts_per_tok;
  Inputs inputs(options.seed);
  SwigluLora true_lora, padded_lora;
  const auto true_stores = expert_tables(backend, config, options.adapters, true_rank, inputs, true_lora);
  const auto padded_stores = expert_tables(backend, config, options.adapters, options.rank, inputs, padded_lora);
  spdlog::info("perf moe_lora: {} MoE layer ({} experts x {}x{}, top {}), {} adapters at r {} (experts {} true, {} "
               "padded), --dtype {}, on {}",
               options.preset, config.n_routed_experts, config.moe_intermediate_size, config.hidden_size,
               config.num_experts_per_tok, options.adapters, options.rank, true_rank, options.rank, options.dtype,
               backend.device_description());
  int64_t true_bytes = 0, padded_bytes = 0;
  for (const auto& store : true_stores) true_bytes += store->bytes();
  for (const auto& store : padded_stores) padded_bytes += store->bytes();
  std::printf("\nexpert adapters of this layer, %d slots, F32: true rank %.1f MiB, padded %.1f MiB\n", options.adapters,
              static_cast<double>(true_bytes) / (1 << 20), static_cast<double>(padded_bytes) / (1 << 20));
  std::printf("\n| tokens | moe ms (graph) | moe_lora true rank %lld ms | moe_lora padded %lld ms | moe_lora, no row "
              "with an adapter, ms |\n| --- | --- | --- | --- | --- |\n",
              static_cast<long long>(true_rank), static_cast<long long>(options.rank));
  for (const int64_t tokens : options.tokens) {
    Tensor h = backend.random_weight(DType::F32, {tokens, config.hidden_size}, seed++, 0.0f, 1.0f);
    Tensor ids = backend.alloc(DType::I32, {tokens, router.top_k}), weights = backend.alloc(DType::F32, {tokens, router.top_k});
    backend.route(h, moe.router, moe.router_bias, router, ids, weights);
    Tensor out = backend.alloc(DType::F32, {tokens, config.hidden_size});
    std::vector<int32_t> slot_values(static_cast<std::size_t>(tokens)), none(slot_values.size(), -1);
    for (std::size_t t = 0; t < slot_values.size(); ++t) slot_values[t] = static_cast<int32_t>(t % static_cast<std::size_t>(options.adapters));
    const Tensor slots = backend.upload_i32(slot_values, {tokens}), no_slots = backend.upload_i32(none, {tokens});
    true_lora.row_adapters = slots;
    padded_lora.row_adapters = slots;
    SwigluLora unused = true_lora;
    unused.row_adapters = no_slots;
    const double moe_ms = time_graph(backend, [&] { backend.moe(h, ids, weights, moe, out); }, options.iterations, "moe_lora");
    const double true_ms = time_graph(
        backend, [&] { backend.moe_lora(h, ids, weights, moe, true_lora, out); }, options.iterations, "moe_lora");
    const double padded_ms = time_graph(
        backend, [&] { backend.moe_lora(h, ids, weights, moe, padded_lora, out); }, options.iterations, "moe_lora");
    const double unused_ms = time_graph(
        backend, [&] { backend.moe_lora(h, ids, weights, moe, unused, out); }, options.iterations, "moe_lora");
    std::printf("| %lld | %.3f | %.3f | %.3f | %.3f |\n", static_cast<long long>(tokens), moe_ms, true_ms, padded_ms,
                unused_ms);
  }
}
#endif

}  // namespace

void add_moe_lora_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "moe_lora",
      "Time one MoE layer of a preset with and without expert LoRA (Backend::moe_lora, adapters at true rank r/top_k "
      "and padded to r) on the GPU");
  command->add_option("--preset", options->preset, "model preset")->capture_default_str();
  command->add_option("--tokens", options->tokens, "token counts")->delimiter(',')->capture_default_str();
  command->add_option("--adapters", options->adapters, "adapter slots, the tokens' slots in turn")->capture_default_str();
  command->add_option("--rank", options->rank, "the adapters' r (experts at r / top_k when true rank)")->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays (median reported)")->capture_default_str();
  command->add_option("--dtype", options->dtype, "compute dtype (float32: split tensor-core operands; bfloat16: wgmma)")
      ->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("moe_lora");
#endif
  });
}

}  // namespace beamline::backend_ops
