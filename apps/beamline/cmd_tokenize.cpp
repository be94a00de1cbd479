// beamline tokenize: text -> token ids, space-separated.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "tokenizer_options.h"
#include "util/error.h"

namespace beamline::cli {
namespace {

struct TokenizeOptions {
  TokenizerOptions tokenizer;
  std::string text_file;
  bool allow_special = false;
  bool jsonl = false;
};

void print_ids(const std::vector<TokenId>& ids) {
  std::string line;
  line.reserve(ids.size() * 7);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
}

void run_tokenize(const TokenizeOptions& options) {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  const std::string input = read_input(options.text_file);
  if (!options.jsonl) {
    print_ids(tokenizer->encode(input, options.allow_special));
    return;
  }
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < input.size();) {
    std::size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    const std::string_view line = std::string_view(input).substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json text;
    try {
      text = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      fail("{}:{}: not JSON: {}", options.text_file.empty() ? "stdin" : options.text_file, line_number, error.what());
    }
    require(text.is_string(), "{}:{}: not a JSON string", options.text_file.empty() ? "stdin" : options.text_file,
            line_number);
    print_ids(tokenizer->encode(text.get<std::string>(), options.allow_special));
  }
}

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand("tokenize", "Encode text into token ids (printed space-separated)");
  add_tokenizer_options(*command, options->tokenizer);
  command->add_option("--text-file", options->text_file, "text to encode (default: standard input), as is");
  command->add_flag("--allow-special", options->allow_special,
                    "turn special-token strings in the text into special tokens (default: encode them as text)");
  command->add_flag("--jsonl", options->jsonl,
                    "the input has one JSON string per line; print one line of ids for each");
  command->callback([options] { run_tokenize(*options); });
});

}  // namespace
}  // namespace beamline::cli
