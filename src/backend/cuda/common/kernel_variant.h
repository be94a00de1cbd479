#pragma once
// Kernels kept in more than one version until the GPU has ranked them: BEAMLINE_CUDA_<FAMILY>=NAME selects a version
// of that family for the whole process (read once per family), so that one benchmark call can time each. `legacy` is
// a family's previous version. Each family lists its names here, the default first; the CUDA backend refuses any other
// value when it starts (check_kernel_variants), naming the variable and the names it takes.
#include <cstddef>
#include <cstdlib>
#include <string_view>

namespace beamline::cuda {

struct KernelFamily {
  const char* variable;
  const std::string_view* names;  // names[0]: the version an unset or empty variable selects
  std::size_t count;
};

// attention/decode.cu: the split-KV decode kernel over E4M3 pools (BF16 pools take per-tile for every name but legacy).
inline constexpr std::string_view kDecodeAttentionNames[] = {
    "query-rows", "per-tile", "legacy", "keys-cvt", "query-rows-keys-bits", "query-rows-values-bits",
    "query-rows-bulk", "query-rows-2-blocks", "query-rows-pdl", "query-rows-pairs"};
// attention/attention.cu: the decode plan's splits per (row, kv head): the cost model's choice (auto), or that times N.
inline constexpr std::string_view kDecodeSplitsNames[] = {"auto", "2x", "3x", "4x"};
// quant/token_moe.cuh, quant/staged_moe.cuh: the one-token MoE of quantized experts (BF16 experts: staged_moe.cuh
// only when the variable says `staged`).
inline constexpr std::string_view kTokenMoeNames[] = {"staged",       "ring",       "legacy",         "staged-wide",
                                                      "staged-wide5", "staged-cvt", "staged-half-cvt"};

inline constexpr KernelFamily kDecodeAttentionFamily{"BEAMLINE_CUDA_DECODE_ATTENTION", kDecodeAttentionNames,
                                                     std::size(kDecodeAttentionNames)};
inline constexpr KernelFamily kDecodeSplitsFamily{"BEAMLINE_CUDA_DECODE_SPLITS", kDecodeSplitsNames,
                                                  std::size(kDecodeSplitsNames)};
inline constexpr KernelFamily kTokenMoeFamily{"BEAMLINE_CUDA_TOKEN_MOE", kTokenMoeNames, std::size(kTokenMoeNames)};
inline constexpr KernelFamily kKernelFamilies[] = {kDecodeAttentionFamily, kDecodeSplitsFamily, kTokenMoeFamily};

// The version named by `variable`, empty when unset (the default version).
inline std::string_view kernel_variant(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr ? std::string_view(value) : std::string_view();
}

// The index of the family's version its variable names: 0 when unset or empty, -1 for a name not in the list.
inline int kernel_variant_index(const KernelFamily& family) {
  const std::string_view name = kernel_variant(family.variable);
  if (name.empty()) return 0;
  for (std::size_t i = 0; i < family.count; ++i)
    if (family.names[i] == name) return static_cast<int>(i);
  return -1;
}

// Fails (beamline::Error) when a family's variable names none of its versions, e.g.
// "BEAMLINE_CUDA_DECODE_SPLITS=5x: expected one of auto, 2x, 3x, 4x (unset: auto)".
void check_kernel_variants();

}  // namespace beamline::cuda
