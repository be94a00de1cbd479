#include "model_options.h"

#include "checkpoint/quantize_tensors.h"

namespace beamline::cli {

void add_quantization_option(CLI::App& command, std::string& quantization) {
  command.add_option("--quantization", quantization,
                     "fp8 | mxfp8 | nvfp4: must match a quantized checkpoint's quantization_config; a BF16 checkpoint "
                     "(or --load-format dummy) is quantized at load, lm_head kept")
      ->check(CLI::IsMember({"fp8", "mxfp8", "nvfp4"}));
}

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
  add_quantization_option(command, source.quantization);
}

void add_quantize_options(CLI::App& command, std::string& quantization, std::vector<std::string>& modules_to_not_convert) {
  command.add_option("--quantization", quantization, "write the projections as fp8 (block 128), mxfp8 or nvfp4")
      ->check(CLI::IsMember({"fp8", "mxfp8", "nvfp4"}));
  command
      .add_option("--modules-to-not-convert", modules_to_not_convert,
                  "tensor-name prefixes whose projections stay in the float dtype (router, norms and embeddings "
                  "always do); 'none' quantizes every projection")
      ->capture_default_str();
}

QuantizationConfig quantize_options_config(const std::string& quantization, std::vector<std::string> modules_to_not_convert) {
  std::erase(modules_to_not_convert, std::string("none"));
  return quantization_config_for(parse_quantization_flag(quantization), std::move(modules_to_not_convert));
}

}  // namespace beamline::cli
