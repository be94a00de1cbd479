#pragma once
// PEFT LoRA adapters (docs/lora.md): a directory with adapter_config.json and adapter_model.safetensors, read and
// checked against the served model before any of it reaches a device.
#include <cstdint>
#include <filesystem>

#include "model/config.h"
#include "model/lora_weights.h"

namespace beamline {

// Reads the adapter in `dir`. Its tensors base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight
// [out, r] (F32, BF16 or F16) must name a projection of docs/model-format.md §3 (<module>.weight: attention, the dense
// MLP, or a routed expert's) listed in target_modules. A module's rank is r unless a rank_pattern key matches its path
// as PEFT matches them (experts at their true rank r / top_k, as Megatron-Bridge's normalize_moe_lora trains them);
// its scale is its alpha (lora_alpha or its alpha_pattern entry) over its own rank (or its square root with rsLoRA).
// Throws beamline::Error naming the file and the key or tensor: a missing file, r or a rank_pattern rank above
// `max_lora_rank` (--max-lora-rank), what this reader does not apply (bias, DoRA, modules_to_save, fan_in_fan_out, a
// regex target_modules), two disagreeing pattern keys matching one module, an unknown module, a module outside
// target_modules, a wrong shape (a tensor whose rank is not its module's) or dtype, an A without its B.
LoraWeights load_peft_adapter(const std::filesystem::path& dir, const ModelConfig& config, int64_t max_lora_rank);

}  // namespace beamline
