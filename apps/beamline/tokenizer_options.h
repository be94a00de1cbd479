#pragma once
// The tokenizer options every text command shares: --tokenizer FILE | --model DIR |
// --tiktoken RANKS --encoding NAME.
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace beamline::cli {

struct TokenizerOptions {
  std::string tokenizer_json;
  std::string model_dir;
  std::string tiktoken_ranks;
  std::string encoding;
};

void add_tokenizer_options(CLI::App& command, TokenizerOptions& options);

// Exactly one source must be given; --model DIR reads DIR/tokenizer.json.
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerOptions& options);

// All of a file ("-" or empty: standard input), as bytes.
std::string read_input(const std::string& path);

}  // namespace beamline::cli
