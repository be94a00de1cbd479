// LoRA on a device backend (docs/lora.md): the tiny MoE model with an adapter on attention, the dense MLP and routed
// experts at their true ranks (rank_pattern: experts at r / top_k, ranks differing per module) gives the cpu
// backend's logits (the reference, itself checked against the merged weights in tests/model/test_lora.cpp), over a
// chunked prefill and decode steps, for two adapters in two slots and for the base model. The cuda instance skips
// only where no device is present (a failure when BEAMLINE_REQUIRE_CUDA=1, the GPU machine).
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend_test_support.h"
#include "checkpoint/lora_adapter.h"
#include "checkpoint/presets.h"
#include "model/beam_model.h"
#include "model/lora_test_support.h"
#include "model/model_test_support.h"
#include "runner/decode_graphs.h"
#include "runner/kv_cache.h"

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

// Decode steps with adapters replay recorded graphs: each row's slot is a step input, so one graph serves any mix.
// Three sequences on slots 0, 1 and none (then the slots rotated, on the same graph) decode four tokens each; the
// graph steps (the first records, the others replay) give the logits of the same steps run op by op on a second
// cache. A step where no row has an adapter records a graph of its own, without the LoRA ops.
TEST_P(LoraForwardTest, DecodeGraphsCarryEachRowsAdapter) {
  if (!backend().supports_graphs()) GTEST_SKIP() << "the " << GetParam() << " backend records no graphs";
  backend().set_compute_dtype(ComputeDType::Float32);
  testing::TempDir dir("lora-graphs");
  const ModelConfig config = preset_config("tiny");
  const BeamWeights weights = testing::write_and_load(config, dir.path() / "base", 11);
  for (const uint64_t seed : {31u, 32u})
    testing::write_random_adapter(testing::true_rank_adapter(seed), *weights.archive,
                                  dir.path() / fmt::format("adapter-{}", seed), testing::kTrueRankPatterns);
  BeamModel model(weights, backend());
  model.enable_lora(2, 8);
  model.load_lora(0, load_peft_adapter(dir.path() / "adapter-31", config, 8));
  model.load_lora(1, load_peft_adapter(dir.path() / "adapter-32", config, 8));
  const KvCacheLayout layout = make_kv_cache_layout(config, default_block_size(config), 64);
  KvCache eager_cache(backend(), config, layout), graph_cache(backend(), config, layout);
  DecodeGraphs graphs(model, graph_cache, 4);

  constexpr int32_t kSequences = 3, kPrompt = 6;
  // Sequence s holds two blocks per group, 2 (s * groups + g) and the next (its 12 positions span two of the tiny
  // preset's blocks); `slots[s]` its adapter; `count` tokens each from position `at`.
  auto batch = [&](const std::vector<int32_t>& slots, int32_t at, int32_t count) {
    ForwardBatch step;
    for (int32_t s = 0; s < kSequences; ++s) {
      SequenceSlice slice{s * count, (s + 1) * count, at, {}};
      for (int32_t g = 0; g < layout.num_groups(); ++g) {
        const int32_t first = 2 * (s * layout.num_groups() + g);
        slice.block_tables.push_back({first, first + 1});
      }
      slice.lora_slot = slots[static_cast<std::size_t>(s)];
      step.sequences.push_back(slice);
      for (int32_t r = 0; r < count; ++r) step.tokens.push_back((s * 131 + (at + r) * 17 + 5) % 500);
      step.logit_rows.push_back((s + 1) * count - 1);
    }
    return step;
  };
  const std::vector<int32_t> mixed = {0, 1, -1}, rotated = {1, -1, 0}, none = {-1, -1, -1};
  for (KvCache* cache : {&eager_cache, &graph_cache}) model.forward(batch(mixed, 0, kPrompt), *cache);
  int32_t at = kPrompt;
  for (const std::vector<int32_t>* slots : {&mixed, &mixed, &rotated, &rotated, &none, &none}) {
    const ForwardBatch step = batch(*slots, at++, 1);
    const std::vector<float> expected = backend().download_f32(model.forward(step, eager_cache));
    const std::optional<Tensor> replayed = graphs.forward(step);
    ASSERT_TRUE(replayed.has_value()) << "a decode step with adapters was not taken by the graphs";
    const std::vector<float> found = backend().download_f32(*replayed);
    testing::expect_close(found, std::vector<double>(expected.begin(), expected.end()), 1e-4,
                          fmt::format("graph logits at position {}, slots {}", at - 1, fmt::join(*slots, ",")));
  }
  EXPECT_EQ(graphs.recorded(), 2) << "one graph for the steps with adapters, one for the step without";
  EXPECT_EQ(graphs.replayed(), 4);
}

INSTANTIATE_TEST_SUITE_P(Backends, LoraForwardTest, ::testing::ValuesIn(testing::backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace beamline
