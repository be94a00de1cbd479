#pragma once
// Shared by the Harmony tests: file reading, the vector directory, JSON comparison, and the real
// o200k_harmony tokenizer when its rank data has been exported (see o200k_ranks_path()).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "harmony/harmony_message.h"
#include "tokenizer/tokenizer.h"
#include "test_paths.h"

namespace beamline::harmony::testing {

inline std::filesystem::path vectors_dir() {
  return std::filesystem::path(test_paths::source_dir()) / "tests" / "data" / "harmony";
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

// How the upstream tests read expected files: CRLF → LF, trailing whitespace removed.
inline std::string expected_text(const std::filesystem::path& path) {
  std::string text = read_file(path);
  std::string unix_text;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    unix_text += text[i];
  }
  while (!unix_text.empty() && std::isspace(static_cast<unsigned char>(unix_text.back()))) unix_text.pop_back();
  return unix_text;
}

// Key order carries no meaning in message JSON, so comparisons go through the sorted form.
inline nlohmann::json unordered(const Json& json) { return nlohmann::json::parse(json.dump()); }

// The o200k_base rank file exported from js-tiktoken at test time (never committed):
// $BEAMLINE_O200K_RANKS, else <build dir>/testdata/o200k_base.tiktoken.
inline std::filesystem::path o200k_ranks_path() {
  if (const char* env = std::getenv("BEAMLINE_O200K_RANKS"); env != nullptr && *env != '\0') return env;
  return std::filesystem::path(BEAMLINE_BINARY_DIR) / "testdata" / "o200k_base.tiktoken";
}

// nullptr when the rank data is not there (the tests that need it skip and say why).
inline const Tokenizer* o200k_harmony() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    const std::filesystem::path path = o200k_ranks_path();
    return std::filesystem::exists(path) ? Tokenizer::from_tiktoken(path, "o200k_harmony") : nullptr;
  }();
  return tokenizer.get();
}

}  // namespace beamline::harmony::testing
