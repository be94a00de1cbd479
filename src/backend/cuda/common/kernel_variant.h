#pragma once
// Kernels kept in more than one version until the GPU has ranked them: BEAMLINE_CUDA_<FAMILY>=NAME selects a version
// of that family for the whole process (read once per family), so that one benchmark call can time each. `legacy` is
// a family's previous version. Families: DECODE_ATTENTION (attention/decode.cu: legacy, keys-cvt), TOKEN_MOE
// (quant/token_moe.cuh: legacy, ring; the default is quant/staged_moe.cuh's).
#include <cstdlib>
#include <string_view>

namespace beamline::cuda {

// The version named by `variable`, empty when unset (the default version).
inline std::string_view kernel_variant(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr ? std::string_view(value) : std::string_view();
}

inline bool legacy_kernel_selected(const char* variable) { return kernel_variant(variable) == "legacy"; }

}  // namespace beamline::cuda
