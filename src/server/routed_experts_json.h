#pragma once
// Routing replay in the JSON answers (docs/rl.md): the expert ids of SampleOutput::routed_experts as int16
// little-endian bytes in base64, the encoding SGLang gives meta_info.routed_experts (decode with
// np.frombuffer(base64.b64decode(s), "<i2").reshape(-1, moe_layers, top_k)).
#include <cstdint>
#include <span>
#include <string>

namespace beamline::server {

inline constexpr const char* kRoutedExpertsField = "routed_experts";

std::string routed_experts_base64(std::span<const int16_t> ids);

}  // namespace beamline::server
