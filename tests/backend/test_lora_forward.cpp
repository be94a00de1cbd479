// LoRA on a device backend (docs/lora.md): the tiny MoE model with an adapter on attention, the dense MLP and routed
// experts at their true ranks (rank_pattern: experts at r / top_k, ranks differing per module) gives the cpu
// backend's logits (the reference, itself checked against the merged weights in tests/model/test_lora.cpp), over a
// chunked prefill and decode steps, for two adapters in two slots and for the base model. The cuda instance skips
// only where no device is present (a failure when BEAMLINE_REQUIRE_CUDA=1, the GPU machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend_test_support.h"
#include "checkpoint/lora_adapter.h"
#include "checkpoint/presets.h"
#include "model/beam_model.h"
#include "model/lora_test_support.h"
#include "model/model_test_support.h"

namespace beamline {
namespace {

class LoraForwardTest : public testing::BackendTest {};

TEST_P(LoraForwardTest, TrueRankAdaptersGiveTheCpuLogits) {
  if (backend().device() == Device::Cpu) GTEST_SKIP() << "the CPU backend is the reference";
  backend().set_compute_dtype(ComputeDType::Float32);
  testing::TempDir dir("lora-forward");
  const ModelConfig config = preset_config("tiny");
  const BeamWeights weights = testing::write_and_load(config, dir.path() / "base", 11);  // BF16, as served
  for (const uint64_t seed : {31u, 32u})
    testing::write_random_adapter(testing::true_rank_adapter(seed), *weights.archive,
                                  dir.path() / fmt::format("adapter-{}", seed), testing::kTrueRankPatterns);
  const std::unique_ptr<Backend> cpu = create_backend("cpu");
  BeamModel reference(weights, *cpu), device(weights, backend());
  for (BeamModel* model : {&reference, &device}) {
    model->enable_lora(2, 8);
    model->load_lora(0, load_peft_adapter(dir.path() / "adapter-31", config, 8));
    model->load_lora(1, load_peft_adapter(dir.path() / "adapter-32", config, 8));
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < 19; ++i) tokens.push_back((i * 104729 + 17) % 500);
  const std::vector<float> base = testing::lora_logits(device, tokens, -1);
  for (const int32_t slot : {0, 1, -1}) {
    const std::vector<float> expected = testing::lora_logits(reference, tokens, slot),
                             found = testing::lora_logits(device, tokens, slot);
    testing::expect_close(found, std::vector<double>(expected.begin(), expected.end()), 1e-3,
                          fmt::format("logits of slot {}, {} vs cpu", slot, GetParam()));
    if (slot < 0) continue;
    double moved = 0;
    for (std::size_t i = 0; i < found.size(); ++i) moved = std::max(moved, double{std::abs(found[i] - base[i])});
    EXPECT_GT(moved, 0.05) << "the adapter of slot " << slot << " barely changes the logits";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LoraForwardTest, ::testing::ValuesIn(testing::backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace beamline
