#pragma once
// What every fuzz target shares. The contract a target checks: bad input is answered by beamline::Error (a message
// naming what and where); anything else (a crash, a sanitizer report, another exception escaping) is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace beamline::fuzz {

// Values a target computes only to read memory (a view's bytes, a derived size) are stored here, so the reads stay.
inline volatile uint64_t sink = 0;

inline std::string_view as_text(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The loaders under test read files: the input is written to one file per process (libFuzzer runs inputs one after
// another in a process), named `name` in the temporary directory.
inline std::filesystem::path write_input_file(const uint8_t* data, std::size_t size, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("beamline-fuzz-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace beamline::fuzz
