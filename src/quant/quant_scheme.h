#pragma once
// The three quantized weight layouts of MODEL_FORMAT.md section 5: their names (beamline's --quantization
// spelling and the quantization_config that vLLM reads) and the dtype and shape of each stored tensor.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace beamline {

enum class QuantScheme : uint8_t {
  Fp8Block,  // "fp8": E4M3 codes, an F32 weight_scale_inv per 128×128 block (DeepSeek-V3)
  Mxfp8,     // "mxfp8": E4M3 codes, an E8M0 weight_scale per 32 elements of a row (OCP MX)
  Nvfp4,     // "nvfp4" (ModelOpt NVFP4): packed E2M1 codes, an E4M3 weight_scale per 16 elements of a row,
             // an F32 weight_scale_2 per tensor
};

inline constexpr int64_t kFp8BlockSize = 128;   // rows and columns of one fp8 scale block
inline constexpr int64_t kMxfp8GroupSize = 32;  // elements of a row per mxfp8 scale
inline constexpr int64_t kNvfp4GroupSize = 16;  // elements of a row per nvfp4 scale

// "fp8", "mxfp8", "nvfp4"; nullopt for anything else.
std::optional<QuantScheme> quant_scheme_from_name(std::string_view name);
std::string_view quant_scheme_name(QuantScheme scheme);
// The scheme a section 5 quant_method (+ quant_algo) names: "fp8", "mxfp8", "modelopt" + "NVFP4"; nullopt otherwise.
std::optional<QuantScheme> quant_scheme_from_method(std::string_view quant_method, std::string_view quant_algo);
// The quant_method (and quant_algo, empty where none) that config.json's quantization_config states for `scheme`.
std::string_view quant_method_of(QuantScheme scheme);
std::string_view quant_algo_of(QuantScheme scheme);

// Rows of the weight that share scales: a band of rows starting at a multiple of this quantizes on its own
// (128 for fp8's blocks, 1 for the per-row groups of mxfp8 and nvfp4).
int64_t quant_row_granularity(QuantScheme scheme);
// Elements of a row per scale along the input dimension (128, 32, 16). in_features must be a multiple of it for
// mxfp8 and nvfp4; fp8's last block column may be cut short by the edge.
int64_t quant_group_size(QuantScheme scheme);

// The stored tensors of one [out, in] projection `X.weight` in `scheme`.
struct QuantLayout {
  DType weight_dtype;                // F8_E4M3, or U8 (two E2M1 codes per byte, low nibble first)
  std::vector<int64_t> weight_shape; // [out, in], or [out, in/2] for nvfp4
  std::string_view scale_suffix;     // "weight_scale_inv" (fp8) or "weight_scale"
  DType scale_dtype;                 // F32, F8_E8M0 (mxfp8; checkpoints may also say U8) or F8_E4M3
  std::vector<int64_t> scale_shape;  // [ceil(out/128), ceil(in/128)], [out, in/32] or [out, in/16]
  bool has_scale_2 = false;          // nvfp4: "weight_scale_2", F32 []
};
// Error (naming the scheme, in_features and the group) when in_features does not fit the scheme, or a
// dimension is not positive.
QuantLayout quant_layout(QuantScheme scheme, int64_t out_features, int64_t in_features);

}  // namespace beamline
