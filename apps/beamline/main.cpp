#include <spdlog/spdlog.h>

#include <cstdlib>
#include <exception>

#include "commands.h"
#include "server/tokenize_endpoints.h"
#include "util/error.h"

namespace beamline::cli {
std::vector<CommandSetup>& command_setups() {
  static std::vector<CommandSetup> setups;
  return setups;
}
}  // namespace beamline::cli

int main(int argc, char** argv) {
  CLI::App app{"beamline: an inference server for Reflection-Beam-class models"};
  app.set_version_flag("--version", beamline::server::beamline_version());
  app.require_subcommand(1);
  for (const auto& setup : beamline::cli::command_setups()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const beamline::Error& error) {
    spdlog::error("{}", error.what());
    return 1;
  } catch (const std::exception& error) {
    spdlog::error("unexpected error: {}", error.what());
    return 1;
  }
  return EXIT_SUCCESS;
}
