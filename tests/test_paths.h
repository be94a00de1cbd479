#pragma once
// Where tests find the source tree and the beamline binary: the paths compiled in (tests/CMakeLists.txt), unless
// the environment names others, as bench/gpu_ctest.sh does when it runs the test binaries on a machine where this
// build tree is not.
#include <cstdlib>
#include <string>

namespace beamline::test_paths {

inline std::string from_environment(const char* variable, const char* compiled) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : compiled;
}
inline std::string source_dir() { return from_environment("BEAMLINE_SOURCE_DIR", BEAMLINE_SOURCE_DIR); }
inline std::string beamline_exe() { return from_environment("BEAMLINE_EXE", BEAMLINE_EXE); }

}  // namespace beamline::test_paths
