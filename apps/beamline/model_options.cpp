#include "model_options.h"

namespace beamline::cli {

void add_model_source_options(CLI::App& command, ModelSource& source) {
  command.add_option("--model", source.model, "checkpoint directory (with --load-format dummy: or a preset name)")
      ->required();
  command
      .add_option("--load-format", source.load_format,
                  "auto: the checkpoint's safetensors; dummy: random weights drawn on the device (no checkpoint)")
      ->capture_default_str();
  command.add_option("--hf-overrides", source.hf_overrides,
                     "JSON object merged into the config with --load-format dummy, e.g. '{\"num_hidden_layers\": 8}'");
  command.add_option("--dummy-seed", source.dummy_seed, "seed of the dummy weights (make-model --seed gives the same)")
      ->capture_default_str();
}

}  // namespace beamline::cli
