#pragma once
// The DFlash block drafter's checkpoint (docs/model-format.md §6): its config.json, the tensors it implies, and
// whether it fits a target. Checked whole at start-up, so that a drafter built for another target (other layers,
// hidden size or vocabulary) is refused naming the key or tensor, before any step runs.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "checkpoint/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/config.h"

namespace beamline {

struct DrafterConfig {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;               // default hidden_size / num_attention_heads
  int64_t intermediate_size = 0;
  int64_t sliding_window = 0;         // the drafter's own window over the context features
  double rope_theta = 10000.0;
  std::optional<double> rms_norm_eps;     // unset: the target's
  std::optional<double> residual_scale;   // unset: the target's
  std::vector<int64_t> target_layer_ids;  // dflash_config: whose outputs feed the context features
  int64_t block_size = 0;                 // dflash_config: anchor + block_size - 1 draft tokens per pass
  int64_t mask_token_id = 0;              // dflash_config: fills the block after the anchor

  // Reads `dir`/config.json; throws Error naming the file and key.
  static DrafterConfig load(const std::filesystem::path& dir);
  nlohmann::json to_json() const;  // what load() reads back
};

// A small drafter that fits `target`, for tests and benchmarks with random weights: 2 layers of the target's attention
// shape, window 64, blocks of 8, reading the target's first, middle and last layers, the mask the last vocabulary id.
DrafterConfig random_drafter_config(const ModelConfig& target);

// The drafter's tensors in file order: fc, hidden_norm, then each layer like a dense target layer (no "model." prefix;
// it shares the target's embed_tokens, final norm and lm_head, so it has none).
std::vector<ExpectedTensor> expected_drafter_tensors(const DrafterConfig& config);

// Throws Error naming the drafter's key when it does not fit `target` or cannot propose `num_speculative_tokens`.
void check_drafter_fits(const DrafterConfig& drafter, const ModelConfig& target, int32_t num_speculative_tokens,
                        const std::filesystem::path& dir);

struct DrafterCheckpoint {
  DrafterConfig config;
  std::shared_ptr<const SafetensorsArchive> archive;  // every expected tensor present, shaped and typed as expected
};

// Loads and checks a drafter for `target`: config, fit, then every tensor (missing, wrong shape or dtype, or a tensor
// the drafter does not have, each named).
DrafterCheckpoint load_drafter_checkpoint(const std::filesystem::path& dir, const ModelConfig& target,
                                          int32_t num_speculative_tokens);

}  // namespace beamline
