#include "checkpoint/model_source.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "checkpoint/quantize_tensors.h"
#include "util/error.h"

namespace beamline {
namespace {

ModelConfig dummy_config(const std::string& model) {
  const std::filesystem::path config_file = std::filesystem::path(model) / "config.json";
  if (std::filesystem::exists(config_file)) return ModelConfig::load(config_file);
  return preset_config(model);
}

ModelConfig with_overrides(const ModelConfig& config, const std::string& overrides) {
  nlohmann::json patch;
  try {
    patch = nlohmann::json::parse(overrides);
  } catch (const nlohmann::json::exception& error) {
    fail("--hf-overrides: not valid JSON: {}", error.what());
  }
  require(patch.is_object(), "--hf-overrides: expected a JSON object such as {{\"num_hidden_layers\": 8}}");
  nlohmann::json merged = config.to_json();
  merged.merge_patch(patch);
  if (patch.contains("num_hidden_layers") && !patch.contains("layer_types") && merged.contains("layer_types") &&
      !merged["layer_types"].empty()) {
    // A shorter or longer stack keeps the preset's pattern of sliding and global layers.
    const nlohmann::json types = merged["layer_types"];
    const int64_t layers = merged["num_hidden_layers"].is_number_integer() ? merged["num_hidden_layers"].get<int64_t>() : 0;
    require(layers >= 1, "--hf-overrides: num_hidden_layers must be a positive integer");
    nlohmann::json resized = nlohmann::json::array();
    for (int64_t i = 0; i < layers; ++i) resized.push_back(types[static_cast<std::size_t>(i) % types.size()]);
    merged["layer_types"] = resized;
  }
  return ModelConfig::from_json(merged, "--hf-overrides");
}

// --quantization against what was loaded: kept, refused, or applied at load (vLLM's online quantization). Dummy
// weights of a config with a quantization_config are drawn in float and quantized as it says.
BeamWeights apply_quantization(BeamWeights weights, const std::string& flag, const std::optional<ModelShard>& shard) {
  const std::optional<QuantizationConfig> stored = weights.config.quantization;
  if (!flag.empty() && stored) {
    const QuantScheme scheme = parse_quantization_flag(flag), stored_scheme = quant_scheme_of(*stored);
    require(stored_scheme == scheme,
            "--quantization {} contradicts the checkpoint's quantization_config (quant_method \"{}\"{}, which is {})",
            flag, stored->quant_method, stored->quant_algo.empty() ? "" : ", quant_algo \"" + stored->quant_algo + "\"",
            quant_scheme_name(stored_scheme));
  }
  if (weights.random_seed && stored) return quantize_weights(std::move(weights), *stored, shard);
  if (flag.empty() || stored) return weights;
  spdlog::info("--quantization {}: quantizing the projections at load (lm_head kept)", flag);
  return quantize_weights(std::move(weights), quantization_config_for(parse_quantization_flag(flag), {"lm_head"}),
                          shard);
}

// The part of the model this rank computes, on a rank of a distributed run.
std::optional<ModelShard> shard_of(const ModelSource& source, const ModelConfig& config) {
  if (!source.parallel) return std::nullopt;
  return model_shard(config, *source.parallel, rank_coordinates(*source.parallel, source.world_rank));
}

}  // namespace

BeamWeights ModelSource::load() const {
  require(!model.empty(), "--model: a checkpoint directory is needed");
  if (!quantization.empty()) parse_quantization_flag(quantization);  // a bad name fails before any loading
  if (load_format == "auto") {
    require(hf_overrides.empty(), "--hf-overrides: only with --load-format dummy (a checkpoint's shapes are fixed)");
    BeamWeights weights = load_checkpoint(model);
    const std::optional<ModelShard> shard = shard_of(*this, weights.config);
    return apply_quantization(std::move(weights), quantization, shard);
  }
  require(load_format == "dummy", "--load-format: unknown format \"{}\" (auto or dummy)", load_format);
  ModelConfig config = dummy_config(model);
  if (!hf_overrides.empty()) config = with_overrides(config, hf_overrides);
  spdlog::info("--load-format dummy: random weights for {} ({} layers, hidden {}), seed {}", model,
               config.num_hidden_layers, config.hidden_size, dummy_seed);
  return apply_quantization(dummy_weights(config, dummy_seed), quantization, shard_of(*this, config));
}

}  // namespace beamline
