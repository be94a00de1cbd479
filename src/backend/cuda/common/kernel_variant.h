#pragma once
// Kernels kept in two versions until the GPU has ranked them: BEAMLINE_CUDA_<FAMILY>=legacy selects the previous
// version of that family for the whole process (read once per family), so that one benchmark call can time both.
// Families: DECODE_ATTENTION (attention/decode.cu's tile copies), TOKEN_MOE (quant/token_moe.cuh's one-token experts).
#include <cstdlib>
#include <string_view>

namespace beamline::cuda {

inline bool legacy_kernel_selected(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr && std::string_view(value) == "legacy";
}

}  // namespace beamline::cuda
