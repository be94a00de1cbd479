// beamline harmony render | parse: Harmony conversations (Harmony's own JSON message form, as in
// tests/data/harmony/cases.json) to prompt text or ids, and completion tokens back to messages.
#include <cctype>
#include <charconv>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "harmony/harmony_parser.h"
#include "harmony/harmony_render.h"
#include "harmony/harmony_template.h"
#include "tokenizer_options.h"
#include "util/error.h"

namespace beamline::cli {
namespace {

using harmony::Json;

struct RenderCommandOptions {
  TokenizerOptions tokenizer;
  std::string conversation_file;
  std::string next_role;
  bool auto_drop_analysis = true;
  bool ids = false;
};

struct ParseCommandOptions {
  TokenizerOptions tokenizer;
  std::string ids_file;
  std::string text_file;
  std::string role;
  bool strict = true;
};

harmony::Role role_option(const std::string& name, const char* option) {
  auto role = harmony::role_from_name(name);
  require(role.has_value(), "{}: '{}' is not a role (system, developer, user, assistant or tool)", option, name);
  return *role;
}

// The checkpoint's harmony.json when --model names one, the defaults otherwise.
harmony::HarmonyTemplate template_for(const TokenizerOptions& tokenizer) {
  return tokenizer.model_dir.empty() ? harmony::HarmonyTemplate{} : harmony::HarmonyTemplate::for_model(tokenizer.model_dir);
}

void write(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

void run_render(const RenderCommandOptions& options) {
  Json json;
  try {
    json = Json::parse(read_input(options.conversation_file));
  } catch (const Json::exception& error) {
    fail("{}: not valid JSON ({})", options.conversation_file, error.what());
  }
  harmony::Conversation conversation;
  try {
    conversation = harmony::conversation_from_json(json, "");
  } catch (const Error& error) {
    fail("{}: {}", options.conversation_file, error.what());
  }
  harmony::RenderOptions render_options = template_for(options.tokenizer).render_options(options.auto_drop_analysis);
  const harmony::Pieces pieces =
      options.next_role.empty()
          ? harmony::render_conversation(conversation, render_options)
          : harmony::render_for_completion(conversation, role_option(options.next_role, "--next-role"), render_options);
  if (!options.ids) {
    write(harmony::pieces_to_text(pieces));
    return;
  }
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  std::string line;
  for (TokenId id : harmony::pieces_to_ids(pieces, *tokenizer)) line += (line.empty() ? "" : " ") + std::to_string(id);
  write(line + "\n");
}

std::vector<TokenId> read_ids(const std::string& path, const Tokenizer& tokenizer) {
  const std::string text = read_input(path);
  std::vector<TokenId> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    const std::string_view word = std::string_view(text).substr(i, end - i);
    long long id = -1;
    auto [stop, error] = std::from_chars(word.data(), word.data() + word.size(), id);
    require(error == std::errc() && stop == word.data() + word.size(), "{}: '{}' (token {}) is not a token id", path,
            word, ids.size());
    require(id >= 0 && static_cast<unsigned long long>(id) < tokenizer.vocab_size(),
            "{}: token id {} (token {}) is outside the vocabulary of {} ids", path, id, ids.size(), tokenizer.vocab_size());
    ids.push_back(static_cast<TokenId>(id));
    i = end;
  }
  return ids;
}

void run_parse(const ParseCommandOptions& options) {
  require(options.ids_file.empty() != options.text_file.empty(), "give exactly one of --ids-file and --text-file");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  const std::vector<TokenId> ids = options.ids_file.empty() ? tokenizer->encode(read_input(options.text_file), true)
                                                            : read_ids(options.ids_file, *tokenizer);
  harmony::ParserOptions parser_options;
  if (!options.role.empty()) parser_options.role = role_option(options.role, "--role");
  parser_options.strict = options.strict;
  parser_options.valid_channels = template_for(options.tokenizer).channels;
  write(harmony::to_json(harmony::parse_completion(*tokenizer, ids, parser_options)).dump(2) + "\n");
}

const CommandRegistration registration([](CLI::App& app) {
  CLI::App* harmony = app.add_subcommand("harmony", "Render Harmony conversations and parse model output");
  harmony->require_subcommand(1);

  auto render = std::make_shared<RenderCommandOptions>();
  CLI::App* render_command = harmony->add_subcommand(
      "render", "Render a conversation ({\"messages\": [...]} in Harmony's JSON form) as prompt text, or ids with --ids");
  render_command->add_option("--conversation", render->conversation_file, "conversation JSON file ('-': standard input)")
      ->required();
  render_command->add_option("--next-role", render->next_role,
                             "append <|start|>ROLE for the model to continue (default: render the messages as they are)");
  render_command->add_option("--auto-drop-analysis", render->auto_drop_analysis,
                             "drop the reasoning of completed turns (true|false, default true)");
  render_command->add_flag("--ids", render->ids, "print token ids (needs a tokenizer option) instead of text");
  add_tokenizer_options(*render_command, render->tokenizer);
  render_command->callback([render] { run_render(*render); });

  auto parse = std::make_shared<ParseCommandOptions>();
  CLI::App* parse_command = harmony->add_subcommand(
      "parse", "Parse completion tokens into messages (printed as a JSON array in Harmony's JSON form)");
  parse_command->add_option("--ids-file", parse->ids_file, "whitespace-separated token ids");
  parse_command->add_option("--text-file", parse->text_file,
                            "Harmony text, encoded with special tokens allowed ('-': standard input)");
  parse_command->add_option("--role", parse->role,
                            "role of the first message when the prompt ended with <|start|>ROLE "
                            "(default: the input starts with <|start|>)");
  parse_command->add_option("--strict", parse->strict,
                            "report malformed output as an error (true|false, default true; false recovers)");
  add_tokenizer_options(*parse_command, parse->tokenizer);
  parse_command->callback([parse] { run_parse(*parse); });
});

}  // namespace
}  // namespace beamline::cli
