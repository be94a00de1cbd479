#pragma once
// generation_config.json of a checkpoint: the end-of-sequence ids and the model's default sampling values
// (applied by the server where a request leaves a field out, as vLLM does with --generation-config auto).
#include <filesystem>
#include <optional>
#include <vector>

#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

struct GenerationConfig {
  std::vector<TokenId> eos_token_ids;  // generation_config.json's eos_token_id, else config.json's
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k, max_new_tokens;

  // Reads `dir`/generation_config.json when present; errors name the file and key.
  static GenerationConfig load(const std::filesystem::path& dir, const ModelConfig& config);
};

}  // namespace beamline
