#pragma once
// Named model shapes for `beamline make-model`: `tiny` (unit tests; a full forward in milliseconds),
// `small` (mid-size, for GPU-versus-CPU checks) and `beam-1.0` (the full docs/model-format.md shapes).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace beamline {

std::vector<std::string> preset_names();
// Throws beamline::Error listing the valid names for an unknown one. Token ids (bos/eos/pad) are the
// Harmony special tokens of the synthetic tokenizer (synthetic_tokenizer.h).
ModelConfig preset_config(std::string_view name);

// `config` cut or grown to `num_layers` layers: dense layers stay first_k_dense_replace while at least one
// MoE layer remains (else num_layers - 1), layer_types follow the same global_attention_every rule when
// the original followed one (else they are truncated), and a default residual_scale is recomputed.
ModelConfig with_num_layers(const ModelConfig& config, int64_t num_layers);

}  // namespace beamline
