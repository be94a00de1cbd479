// --kv-cache-dtype fp8 (E4M3) on the CPU: the runner counts its blocks at one byte an element, so the same budget
// holds twice the BF16 blocks, and a model's logits through an FP8 cache stay near the F32 cache's: with scale 1.0 on
// K and V of magnitude ~1, and with --calculate-kv-scales on a model whose K and V are 1024 times larger or smaller
// (where scale 1.0 is far off).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "tensor/dtype.h"
#include "../model/model_test_support.h"
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

// `weights` with every layer's k_proj and v_proj times `factor` and q_proj and o_proj over it: the same function
// (scores q·k and the output o Wo are unchanged; RoPE and SSMax are linear), K and V `factor` times larger.
BeamWeights with_kv_magnitude(const BeamWeights& weights, float factor) {
  std::vector<HostTensor> scaled;
  for (const LayerWeights& layer : weights.layers) {
    for (const auto& [view, multiplier] : {std::pair{&layer.q_proj.weight, 1.0f / factor},
                                           {&layer.k_proj.weight, factor},
                                           {&layer.v_proj.weight, factor},
                                           {&layer.o_proj.weight, 1.0f / factor}}) {
      auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(view->numel()) * sizeof(float));
      auto* out = reinterpret_cast<float*>(bytes->data());
      for (int64_t i = 0; i < view->numel(); ++i)
        out[i] = multiplier * (view->dtype == DType::BF16 ? bf16_to_f32(view->as<uint16_t>()[i]) : view->as<float>()[i]);
      scaled.push_back({TensorView{view->name, DType::F32, view->shape, bytes->data(), bytes->size()}, bytes});
    }
  }
  return with_received_tensors(weights, scaled);
}

// Mean over the rows of KL(softmax(p) || softmax(q)), rows of `vocab` logits.
double mean_kl(const std::vector<float>& p, const std::vector<float>& q, int64_t vocab) {
  const auto log_softmax = [&](const float* row) {
    const double top = *std::max_element(row, row + vocab);
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(row[i] - top);
    std::vector<double> result(static_cast<std::size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) result[static_cast<std::size_t>(i)] = row[i] - top - std::log(total);
    return result;
  };
  const auto rows = static_cast<int64_t>(p.size()) / vocab;
  double sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> log_p = log_softmax(p.data() + r * vocab), log_q = log_softmax(q.data() + r * vocab);
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  }
  return sum / static_cast<double>(rows);
}

TEST(Fp8KvCache, CalculatedScalesHoldKAndVFarFromOne) {
  testing::TempDir dir("fp8-kv-scales");
  // All layers dense: the MoE's discrete routing makes a random model's logits jump with any rounding (one expert
  // choice flipped by the FP8 rounding of one layer's V moved the mean KL 25-fold), which would hide the scales'
  // effect.
  ModelConfig config = preset_config("tiny");
  config.first_k_dense_replace = config.num_hidden_layers;
  const BeamWeights original = testing::write_and_load(config, dir.path(), 6);
  const std::vector<int32_t> prompt{3, 17, 250, 4, 99, 12, 7, 300, 41, 5};
  for (float factor : {1024.0f, 1.0f / 1024}) {
    const BeamWeights weights = with_kv_magnitude(original, factor);
    std::unique_ptr<Backend> backend = create_backend("cpu");
    BeamModel model(weights, *backend);
    // Prefill in two chunks (the second reads keys the first stored), then one decode step.
    const auto logits = [&](DType kv_dtype, bool calculate) {
      if (calculate) model.calculate_kv_scales();
      SequenceRunner runner(model, 16, 6, kv_dtype);
      runner.step(std::span(prompt).first(5), false);
      const std::vector<float> scales = backend->download_f32(model.kv_scales());
      EXPECT_FALSE(model.kv_scales_pending());
      std::vector<float> result = runner.step(std::span(prompt).subspan(5), true);
      const std::vector<float> decoded = runner.step(std::span(prompt).first(1), true);
      result.insert(result.end(), decoded.begin(), decoded.end());
      EXPECT_EQ(backend->download_f32(model.kv_scales()), scales) << "the first step's scales are kept";
      return std::pair{result, scales};
    };
    const auto [exact, ones] = logits(DType::F32, false);
    const auto [unscaled, same_ones] = logits(DType::F8_E4M3, false);
    const auto [calculated, scales] = logits(DType::F8_E4M3, true);
    EXPECT_EQ(ones, std::vector<float>(ones.size(), 1.0f));
    for (std::size_t i = 0; i < scales.size(); ++i)  // k_scale = max|k| / 200, v_scale = max|v| / 100
      EXPECT_TRUE(scales[i] > factor / 1000 && scales[i] < factor / 10) << "factor " << factor << " scale " << i
                                                                         << " = " << scales[i];
    const int64_t vocab = weights.config.vocab_size;
    const double with_scales = mean_kl(exact, calculated, vocab), at_one = mean_kl(exact, unscaled, vocab);
    // Measured: 2.2e-4 with the calculated scales at both factors (as much as scale 1.0 costs at magnitude 1), 0.075
    // (x1024) and 0.099 (x1/1024) at scale 1.0.
    EXPECT_LT(with_scales, 1e-3) << "factor " << factor;
    EXPECT_GT(at_one, 30 * with_scales) << "factor " << factor << ": scale 1.0 should be far off";
    RecordProperty(fmt::format("mean_kl_x{}", factor), fmt::format("{} scaled, {} at 1.0", with_scales, at_one));
  }
}

TEST(Fp8KvCache, CalculateKvScalesNeedsTheFp8Cache) {
  EngineConfig config;
  config.calculate_kv_scales = true;
  EXPECT_THROW(config.validate(), Error);
  config.kv_cache_dtype = "fp8";
  EXPECT_NO_THROW(config.validate());
}

}  // namespace
}  // namespace beamline
