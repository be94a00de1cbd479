// beamline detokenize: token ids -> the exact bytes they stand for.
#include <charconv>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "tokenizer_options.h"
#include "util/error.h"

namespace beamline::cli {
namespace {

struct DetokenizeOptions {
  TokenizerOptions tokenizer;
  std::string ids;
  std::string ids_file;
  bool lossy = false;
};

// Ids separated by whitespace and/or commas.
std::vector<TokenId> parse_ids(std::string_view text, std::string_view origin) {
  std::vector<TokenId> ids;
  const auto is_separator = [](char c) { return c == ' ' || c == ',' || c == '\n' || c == '\t' || c == '\r'; };
  for (std::size_t at = 0; at < text.size();) {
    if (is_separator(text[at])) {
      ++at;
      continue;
    }
    std::size_t end = at;
    while (end < text.size() && !is_separator(text[end])) ++end;
    const std::string_view entry = text.substr(at, end - at);
    TokenId id = -1;
    const auto [stop, error] = std::from_chars(entry.data(), entry.data() + entry.size(), id);
    require(error == std::errc() && stop == entry.data() + entry.size() && id >= 0,
            "{}: \"{}\" (entry {}) is not a token id (a non-negative integer)", origin, entry, ids.size());
    ids.push_back(id);
    at = end;
  }
  return ids;
}

void run_detokenize(const DetokenizeOptions& options) {
  require(options.ids.empty() || options.ids_file.empty(), "give --ids or --ids-file, not both");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  const std::vector<TokenId> ids =
      options.ids.empty()
          ? parse_ids(read_input(options.ids_file), options.ids_file.empty() ? "stdin" : options.ids_file)
          : parse_ids(options.ids, "--ids");
  const std::string text = options.lossy ? tokenizer->decode(ids) : tokenizer->decode_bytes(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<DetokenizeOptions>();
  CLI::App* command = app.add_subcommand(
      "detokenize", "Decode token ids (from --ids, --ids-file or standard input) and print the bytes they stand for");
  add_tokenizer_options(*command, options->tokenizer);
  command->add_option("--ids", options->ids, "token ids separated by spaces or commas");
  command->add_option("--ids-file", options->ids_file, "file with the token ids (default: standard input)");
  command->add_flag("--lossy", options->lossy, "replace invalid UTF-8 (a character split by the ids) with U+FFFD");
  command->callback([options] { run_detokenize(*options); });
});

}  // namespace
}  // namespace beamline::cli
