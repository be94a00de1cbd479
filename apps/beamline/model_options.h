#pragma once
// The options that say where a command's model comes from (--model, --load-format, --hf-overrides, --quantization), shared by
// the commands that load one.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "checkpoint/model_source.h"

namespace beamline::cli {

void add_model_source_options(CLI::App& command, ModelSource& source);
// --quantization (ModelSource::quantization).
void add_quantization_option(CLI::App& command, std::string& quantization);
// The options of commands that write quantized checkpoints (make-model, quantize): --quantization and
// --modules-to-not-convert (default lm_head, as DeepSeek-V3's and ModelOpt's checkpoints leave it).
void add_quantize_options(CLI::App& command, std::string& quantization, std::vector<std::string>& modules_to_not_convert);
// The quantization_config those options ask for.
QuantizationConfig quantize_options_config(const std::string& quantization, std::vector<std::string> modules_to_not_convert);

}  // namespace beamline::cli
