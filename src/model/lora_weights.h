#pragma once
// One LoRA adapter as the model takes it (docs/lora.md): for each adapted projection, A [rank, in] and B [out, rank]
// in F32 on the host, B already multiplied by the adapter's scale (lora_alpha / r, or / sqrt(r) with rsLoRA), so that
// the projection computes y = x Wᵀ + (x Aᵀ) Bᵀ. checkpoint/lora_adapter.h reads and checks PEFT's files into it.
#include <cstdint>
#include <string_view>
#include <vector>

namespace beamline {

enum class LoraProjection { Q, K, V, O, Gate, Up, Down };
inline constexpr LoraProjection kLoraProjections[] = {LoraProjection::Q,    LoraProjection::K,  LoraProjection::V,
                                                      LoraProjection::O,    LoraProjection::Gate, LoraProjection::Up,
                                                      LoraProjection::Down};
// PEFT's module name: "q_proj" .. "down_proj".
inline std::string_view lora_projection_name(LoraProjection projection) {
  constexpr std::string_view kNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return kNames[static_cast<int>(projection)];
}

struct LoraModule {
  int64_t layer = 0;
  LoraProjection projection = LoraProjection::Q;
  int64_t expert = -1;  // a routed expert's projection (MoE LoRA); -1: attention or the dense MLP
  int64_t rank = 0, in = 0, out = 0;
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank], times the scale
};

struct LoraWeights {
  int64_t rank = 0;
  double scale = 1.0;
  std::vector<LoraModule> modules;
};

}  // namespace beamline
