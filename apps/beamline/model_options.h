#pragma once
// The options that say where a command's model comes from (--model, --load-format, --hf-overrides), shared by
// the commands that load one.
#include <CLI/CLI.hpp>

#include "checkpoint/model_source.h"

namespace beamline::cli {

void add_model_source_options(CLI::App& command, ModelSource& source);

}  // namespace beamline::cli
