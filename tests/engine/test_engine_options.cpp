// The engine's command-line options where they read the environment: --batch-invariant also comes from vLLM's
// VLLM_BATCH_INVARIANT=1, and the flag still decides when given.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/engine_config.h"

namespace beamline {
namespace {

// Parses `args` with the engine's options registered on a fresh command, VLLM_BATCH_INVARIANT set to `env` (nullptr:
// unset).
EngineConfig parse(const char* env, std::vector<std::string> args) {
  if (env != nullptr)
    setenv("VLLM_BATCH_INVARIANT", env, 1);
  else
    unsetenv("VLLM_BATCH_INVARIANT");
  EngineConfig config;
  CLI::App command;
  add_engine_options(command, config);
  std::vector<const char*> argv{"serve"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  command.parse(static_cast<int>(argv.size()), argv.data());
  unsetenv("VLLM_BATCH_INVARIANT");
  return config;
}

TEST(EngineOptions, BatchInvariantFromTheFlagOrVllmsEnvironmentVariable) {
  EXPECT_FALSE(parse(nullptr, {}).batch_invariant);
  EXPECT_TRUE(parse(nullptr, {"--batch-invariant"}).batch_invariant);
  EXPECT_TRUE(parse("1", {}).batch_invariant);
  EXPECT_FALSE(parse("0", {}).batch_invariant);
  EXPECT_FALSE(parse("1", {"--batch-invariant=false"}).batch_invariant);
}

}  // namespace
}  // namespace beamline
