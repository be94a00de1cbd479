#include "runner/routed_experts_step.h"

#include "util/error.h"

namespace beamline {

RoutedExpertsStep::RoutedExpertsStep(std::unique_ptr<ModelStep> step, Backend& backend, const Tensor& routed_experts,
                                     int64_t rows)
    : step_(std::move(step)),
      layers_(routed_experts.dim(0)),
      padded_rows_(routed_experts.dim(1)),
      top_k_(routed_experts.dim(2)),
      rows_(rows) {
  require(routed_experts.dtype() == DType::I32 && rows <= padded_rows_,
          "routed experts: {} captured for a step of {} rows", describe(routed_experts), rows);
  host_.resize(static_cast<std::size_t>(routed_experts.numel()));
  download_ = backend.download_later(routed_experts, host_.data());
}

RoutedExperts RoutedExpertsStep::routed_experts() {
  download_->wait();
  RoutedExperts out{static_cast<int32_t>(layers_), static_cast<int32_t>(top_k_), {}};
  out.ids.resize(static_cast<std::size_t>(rows_ * layers_ * top_k_));
  // Layer-major on the device (each layer's router writes its own slice), token-major for the engine.
  for (int64_t layer = 0; layer < layers_; ++layer)
    for (int64_t row = 0; row < rows_; ++row)
      for (int64_t j = 0; j < top_k_; ++j)
        out.ids[static_cast<std::size_t>((row * layers_ + layer) * top_k_ + j)] =
            static_cast<int16_t>(host_[static_cast<std::size_t>((layer * padded_rows_ + row) * top_k_ + j)]);
  return out;
}

}  // namespace beamline
