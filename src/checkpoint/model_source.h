#pragma once
// Where a model's weights come from, with vLLM's option names: a checkpoint directory (`--load-format auto`), or
// random weights drawn by the backend itself, on the device for a GPU (`--load-format dummy`), from the config.json
// of a directory or from a preset name, with `--hf-overrides` (a JSON object merged into the config, e.g.
// {"num_hidden_layers": 8}) — full-width models run with no checkpoint on disk.
#include <cstdint>
#include <optional>
#include <string>

#include "model/weights.h"
#include "parallel/parallel_config.h"

namespace beamline {

struct ModelSource {
  std::string model;               // checkpoint directory; with dummy, also a preset name (tiny, small, beam-1.0)
  std::string load_format = "auto";  // auto | dummy
  std::string hf_overrides;        // JSON object applied to the config (dummy only)
  uint64_t dummy_seed = 0;         // seed of the dummy weights: equal to make-model --seed's checkpoint
  // --quantization (vLLM's flag): fp8, mxfp8 or nvfp4. A checkpoint whose quantization_config names the same scheme
  // loads as it is; one that names another is refused naming both; a float checkpoint (or dummy weights) is
  // quantized at load, leaving lm_head in its float dtype as quantized checkpoints do. Empty: as the checkpoint is.
  std::string quantization;
  // Set on each rank of a distributed run: --quantization at load then quantizes only what this rank computes
  // (quantize_weights with its shard), so no rank holds another's quantized experts or layers.
  std::optional<ParallelConfig> parallel;
  int32_t world_rank = 0;

  // Validates the combination and loads; errors name the option.
  BeamWeights load() const;
};

}  // namespace beamline
