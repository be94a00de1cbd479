// backend_ops: the GPU op harness, outside the shipped binary (llama.cpp's test-backend-ops, in spirit).
//   backend_ops test [--device cuda] [--dtype float32|bfloat16] [--filter GROUPS] [--small]
//     every op group of the table below against the reference backend; prints a results table, exits 1 on a failure
//   backend_ops perf FAMILY [options]
//     times a family's ops on the GPU, each figure next to its floor (bytes / 4.8 TB/s, FLOPs / 758 TFLOP/s BF16 or
//     1,341 FP8); FAMILY is attention, linear, moe, sample, fp8, micro (MXFP8/NVFP4), layer, all_reduce_norm or roof
//     (this GPU's measured roofs: streaming-read bandwidth, cuBLAS BF16 GEMM)
// The cases of each family live in its file (op_families.h).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "harness.h"
#include "op_families.h"
#include "util/error.h"

namespace beamline::backend_ops {
namespace {

// CTest's SKIP_RETURN_CODE for the harness's own CTest entries (tests/backend_ops/CMakeLists.txt).
constexpr int kSkipped = 77;

// Test mode's op groups, in the order they run (the random inputs follow this order, so a seed reproduces a run).
const std::vector<std::pair<const char*, void (*)(Harness&)>> kTestGroups{
    {"place_tokens", test_place_tokens}, {"embedding", test_embedding},     {"rms_norm", test_norms},
    {"linear", test_linear},             {"linear_rows", test_linear_rows}, {"linear_many", test_linear_many},
    {"rope", test_rope_ssmax},           {"attention", test_attention},     {"route", test_route},
    {"moe", test_moe},                   {"swiglu", test_swiglu},           {"lm_head", test_lm_head},
    {"sample", test_sample},             {"fp8", test_fp8},                 {"mxfp8", test_mxfp8},
    {"nvfp4", test_nvfp4},               {"lora", test_lora},               {"moe_lora", test_moe_lora},
    {"amax_scale", test_amax_scale}, {"all_reduce_norm", test_all_reduce_norm},
    {"block_attention", test_block_attention}, {"batch_invariance", test_batch_invariance},
    {"kv_decode", test_kv_decode}};

// A device that is required: BEAMLINE_REQUIRE_CUDA=1 marks the machine the device tests exist for.
bool device_required() {
  const char* required = std::getenv("BEAMLINE_REQUIRE_CUDA");
  return required != nullptr && std::string_view(required) == "1";
}

int run_tests(const TestOptions& options, bool skip_without_device) {
  std::unique_ptr<Backend> device;
  try {
    device = create_backend(options.device);
  } catch (const Error& error) {
    if (!skip_without_device || device_required()) throw;
    spdlog::warn("backend_ops test: skipped, device '{}' unavailable: {}", options.device, error.what());
    return kSkipped;
  }
  device->set_compute_dtype(parse_compute_dtype(options.dtype, device->device()));
  require(device->set_batch_invariant(options.batch_invariant), "backend_ops test: {} has no batch-invariant mode",
          device->name());
  std::unique_ptr<Backend> reference = create_backend(options.reference);
  Harness harness(*device, *reference, options);
  spdlog::info("backend_ops test: {} (--dtype {}{}) against {} (seed {})", device->name(), options.dtype,
               options.batch_invariant ? ", batch-invariant" : "", reference->name(), options.seed);
  // batch_invariance holds rows bit for bit, which only the batch-invariant mode promises: it runs with that mode only.
  for (const auto& [name, body] : kTestGroups)
    if (harness.wanted(name) && (std::string_view(name) != "batch_invariance" || options.batch_invariant)) body(harness);
  harness.print_table();
  require(harness.failures() == 0, "backend_ops test: {} case(s) failed", harness.failures());
  return EXIT_SUCCESS;
}

void add_test_mode(CLI::App& app, int& status) {
  auto options = std::make_shared<TestOptions>();
  auto skip_without_device = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "test",
      "Check every op of a backend against the reference backend on random inputs (Beam-1.0 shapes, odd sizes, "
      "window and block boundaries); prints a results table, exits 1 on any failure");
  command->add_option("--device", options->device, "backend under test")->capture_default_str();
  command->add_option("--reference", options->reference, "reference backend")->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random inputs")->capture_default_str();
  command->add_option("--filter", options->filter,
                      "only the op groups whose name contains this, or one of a comma-separated list (place_tokens, "
                      "embedding, rms_norm, linear, linear_rows, linear_many, rope, attention, route, moe, swiglu, "
                      "lm_head, sample, fp8, mxfp8, nvfp4, lora, moe_lora, amax_scale, all_reduce_norm, block_attention, "
                      "batch_invariance)");
  command
      ->add_option("--dtype", options->dtype,
                   "compute dtype of the backend under test (float32: FP32-accurate tolerances; bfloat16: BF16 ones)")
      ->capture_default_str();
  command->add_flag("--small", options->small_only, "skip the Beam-1.0-sized cases (quick runs on a CPU)");
  command->add_flag("--batch-invariant", options->batch_invariant,
                    "put the backend under test in batch-invariant mode (the batch_invariance group needs it)");
  command->add_flag("--skip-without-device", *skip_without_device,
                    "exit 77 (skipped) when the device backend cannot start, unless BEAMLINE_REQUIRE_CUDA=1");
  command->callback([options, skip_without_device, &status] { status = run_tests(*options, *skip_without_device); });
}

}  // namespace
}  // namespace beamline::backend_ops

int main(int argc, char** argv) {
  using namespace beamline::backend_ops;
  CLI::App app{"backend_ops: the backend op harness (test mode against the reference backend, perf mode against floors)"};
  app.require_subcommand(1);
  int status = EXIT_SUCCESS;
  add_test_mode(app, status);
  CLI::App* perf = app.add_subcommand("perf", "Time a family of ops on the GPU, each figure next to its floor");
  perf->require_subcommand(1);
  for (auto add : {add_attention_perf, add_linear_perf, add_moe_perf, add_sample_perf, add_fp8_perf, add_micro_perf, add_lora_perf, add_moe_lora_perf, add_layer_perf,
                   add_all_reduce_norm_perf, add_roof_perf})
    add(*perf);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const beamline::Error& error) {
    spdlog::error("{}", error.what());
    return 1;
  } catch (const std::exception& error) {
    spdlog::error("unexpected error: {}", error.what());
    return 1;
  }
  return status;
}
