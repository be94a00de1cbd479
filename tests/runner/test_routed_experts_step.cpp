// RoutedExpertsStep: the layer-major ids a forward pass wrote come back token-major, as int16, for the batch's rows
// only (a decode graph's padded rows dropped); sampling passes through to the wrapped step.
#include <gtest/gtest.h>

#include <numeric>

#include "backend/registry.h"
#include "runner/routed_experts_step.h"

namespace beamline {
namespace {

class CountingStep : public ModelStep {
 public:
  void sample(std::vector<RowSampling> rows) override { sampled = rows.size(); }
  std::vector<SampledToken> tokens() override { return std::vector<SampledToken>(sampled); }
  std::size_t sampled = 0;
};

TEST(RoutedExpertsStep, ReturnsTheBatchRowsTokenMajor) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  constexpr int64_t layers = 3, padded = 4, top_k = 2, rows = 3;
  std::vector<int32_t> device(layers * padded * top_k);
  std::iota(device.begin(), device.end(), 0);  // id = (layer * padded + row) * top_k + j
  const Tensor routed = backend->upload_i32(device, {layers, padded, top_k});
  auto inner = std::make_unique<CountingStep>();
  CountingStep* counting = inner.get();
  RoutedExpertsStep step(std::move(inner), *backend, routed, rows);
  step.sample(std::vector<RowSampling>(2));
  EXPECT_EQ(step.tokens().size(), 2u);
  EXPECT_EQ(counting->sampled, 2u);
  const RoutedExperts out = step.routed_experts();
  EXPECT_EQ(out.num_moe_layers, layers);
  EXPECT_EQ(out.top_k, top_k);
  ASSERT_EQ(out.ids.size(), static_cast<std::size_t>(rows * layers * top_k));
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t layer = 0; layer < layers; ++layer)
      for (int64_t j = 0; j < top_k; ++j)
        EXPECT_EQ(out.ids[static_cast<std::size_t>((row * layers + layer) * top_k + j)],
                  (layer * padded + row) * top_k + j)
            << "row " << row << " layer " << layer << " slot " << j;
}

TEST(RoutedExpertsStep, RefusesMoreRowsThanCaptured) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  const Tensor routed = backend->upload_i32(std::vector<int32_t>(8), {2, 2, 2});
  EXPECT_THROW(RoutedExpertsStep(std::make_unique<CountingStep>(), *backend, routed, 3), Error);
}

}  // namespace
}  // namespace beamline
