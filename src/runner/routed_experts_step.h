#pragma once
// Routing replay on top of a runner's step: the router's expert ids of the step's rows (written by the forward pass into
// one I32 [moe_layers, R, top_k] tensor) come back with one asynchronous download queued right behind the forward
// pass, and are handed out per token row as the engine wants them (ModelStep::routed_experts).
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/model_runner.h"

namespace beamline {

class RoutedExpertsStep final : public ModelStep {
 public:
  // `routed_experts`: I32 [moe_layers, R, top_k] on `backend` with R >= rows (a decode graph's padded rows); only its
  // first `rows` rows per layer are the batch's. The download is queued now; `backend` must outlive this step.
  RoutedExpertsStep(std::unique_ptr<ModelStep> step, Backend& backend, const Tensor& routed_experts, int64_t rows);

  void sample(std::vector<RowSampling> rows) override { step_->sample(std::move(rows)); }
  std::vector<SampledToken> tokens() override { return step_->tokens(); }
  RoutedExperts routed_experts() override;
  std::vector<float> raw_logits(std::span<const int32_t> rows) override { return step_->raw_logits(rows); }

 private:
  std::unique_ptr<ModelStep> step_;
  int64_t layers_, padded_rows_, top_k_, rows_;
  std::vector<int32_t> host_;  // [layers, padded_rows, top_k], as on the device
  std::unique_ptr<PendingDownload> download_;
};

}  // namespace beamline
