#include "checkpoint/model_source.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
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
  } catch (const nlohmann::json::parse_error& error) {
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

}  // namespace

BeamWeights ModelSource::load() const {
  require(!model.empty(), "--model: a checkpoint directory is needed");
  if (load_format == "auto") {
    require(hf_overrides.empty(), "--hf-overrides: only with --load-format dummy (a checkpoint's shapes are fixed)");
    return load_checkpoint(model);
  }
  require(load_format == "dummy", "--load-format: unknown format \"{}\" (auto or dummy)", load_format);
  ModelConfig config = dummy_config(model);
  if (!hf_overrides.empty()) config = with_overrides(config, hf_overrides);
  spdlog::info("--load-format dummy: random weights for {} ({} layers, hidden {}), seed {}", model,
               config.num_hidden_layers, config.hidden_size, dummy_seed);
  return dummy_weights(config, dummy_seed);
}

}  // namespace beamline
