// --kv-cache-dtype fp8 (E4M3, per-tensor scale 1.0) on the CPU: the runner counts its blocks at one byte an element,
// so the same budget holds twice the BF16 blocks, and a model's logits through an FP8 cache stay near the F32 cache's.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "engine/engine_config.h"
#include "model/beam_model.h"
#include "runner/beam_model_runner.h"
#include "runner/sequence_runner.h"

namespace beamline {
namespace {

TEST(Fp8KvCache, TheSameBudgetHoldsTwiceTheBf16Blocks) {
  const BeamWeights weights = dummy_weights(preset_config("tiny"), 3);
  EngineConfig config;
  config.kv_cache_memory_bytes = int64_t{1} << 20;
  config.kv_cache_dtype = "bfloat16";
  const BeamModelRunner bf16(weights, "cpu", config);
  config.kv_cache_dtype = "fp8";
  const BeamModelRunner fp8(weights, "cpu", config);
  EXPECT_EQ(bf16.kv_bytes_per_block(), 2 * fp8.kv_bytes_per_block());
  EXPECT_EQ(fp8.kv_layout().num_blocks, 2 * bf16.kv_layout().num_blocks);
}

TEST(Fp8KvCache, LogitsStayNearTheF32Cache) {
  const BeamWeights weights = dummy_weights(preset_config("tiny"), 4);
  std::unique_ptr<Backend> backend = create_backend("cpu");
  BeamModel model(weights, *backend);
  const std::vector<int32_t> prompt{3, 17, 250, 4, 99, 12, 7, 300, 41, 5};
  // Prefill in two chunks, so that the second reads keys the first stored as FP8.
  const auto logits = [&](DType kv_dtype) {
    SequenceRunner runner(model, 16, 6, kv_dtype);
    runner.step(std::span(prompt).first(5), false);
    return runner.step(std::span(prompt).subspan(5), true);
  };
  const std::vector<float> exact = logits(DType::F32), fp8 = logits(DType::F8_E4M3);
  ASSERT_EQ(exact.size(), fp8.size());
  double largest = 0.0, difference = 0.0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    largest = std::max(largest, std::abs(double{exact[i]}));
    difference = std::max(difference, std::abs(double{exact[i]} - fp8[i]));
  }
  EXPECT_GT(difference, 0.0);  // the cache really is FP8
  EXPECT_LT(difference, 0.1 * largest);
}

}  // namespace
}  // namespace beamline
