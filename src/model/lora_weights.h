#pragma once
// One LoRA adapter as the model takes it (docs/lora.md): for each adapted projection, A [rank, in] and B [out, rank]
// in F32 on the host at the module's own rank (r, or its rank_pattern entry: experts at r / top_k stay at that rank),
// B already multiplied by the module's scale, so that the projection computes y = x Wᵀ + (x Aᵀ) Bᵀ.
// checkpoint/lora_adapter.h reads and checks PEFT's files into it.
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
  // lora_alpha / rank of this module (its own rank, and its alpha_pattern entry if any), or / sqrt(rank) with rsLoRA:
  // an expert at r_e = r / top_k has alpha / r_e, as PEFT (rank_pattern) and Megatron-Bridge (normalize_moe_lora) scale.
  double scale = 1.0;
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank], times the scale
};

struct LoraWeights {
  int64_t rank = 0;    // the config's r (modules without a rank_pattern entry)
  double scale = 1.0;  // the scale of a module of rank r without an alpha_pattern entry
  std::vector<LoraModule> modules;
};

}  // namespace beamline
