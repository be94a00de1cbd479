#pragma once
// Subcommands register themselves: each cmd_<name>.cpp defines one CommandRegistration at namespace
// scope, so adding a command never touches main.cpp.
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace beamline::cli {

// Called with the top-level app; the function adds its subcommand and sets its callback.
using CommandSetup = std::function<void(CLI::App&)>;

std::vector<CommandSetup>& command_setups();

struct CommandRegistration {
  explicit CommandRegistration(CommandSetup setup) { command_setups().push_back(std::move(setup)); }
};

}  // namespace beamline::cli
