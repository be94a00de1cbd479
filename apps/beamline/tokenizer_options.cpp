#include "tokenizer_options.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "util/error.h"

namespace beamline::cli {

void add_tokenizer_options(CLI::App& command, TokenizerOptions& options) {
  command.add_option("--tokenizer", options.tokenizer_json, "Hugging Face tokenizer.json (byte-level BPE)");
  command.add_option("--model", options.model_dir, "Model directory; its tokenizer.json is used");
  command.add_option("--tiktoken", options.tiktoken_ranks, "tiktoken rank file (base64 token, space, rank per line)");
  command.add_option("--encoding", options.encoding, "Encoding of the --tiktoken file: o200k_base or o200k_harmony");
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerOptions& options) {
  const int sources = !options.tokenizer_json.empty() + !options.model_dir.empty() + !options.tiktoken_ranks.empty();
  require(sources == 1, "give exactly one of --tokenizer FILE, --model DIR, --tiktoken RANKS --encoding NAME");
  require(options.encoding.empty() || !options.tiktoken_ranks.empty(), "--encoding goes with --tiktoken");
  if (!options.tokenizer_json.empty()) return Tokenizer::from_tokenizer_json(options.tokenizer_json);
  if (!options.model_dir.empty()) {
    return Tokenizer::from_tokenizer_json(std::filesystem::path(options.model_dir) / "tokenizer.json");
  }
  require(!options.encoding.empty(), "--tiktoken needs --encoding o200k_base or o200k_harmony");
  return Tokenizer::from_tiktoken(options.tiktoken_ranks, options.encoding);
}

std::string read_input(const std::string& path) {
  if (path.empty() || path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream file(path, std::ios::binary);
  require(file.good(), "cannot open {}", path);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

}  // namespace beamline::cli
