#include "harmony/harmony_render.h"

#include <algorithm>

#include "harmony/harmony_tools.h"
#include "util/error.h"

namespace beamline::harmony {

namespace {

constexpr const char* kStart = "<|start|>";
constexpr const char* kMessage = "<|message|>";
constexpr const char* kEnd = "<|end|>";
constexpr const char* kCall = "<|call|>";
constexpr const char* kChannel = "<|channel|>";
constexpr const char* kConstrain = "<|constrain|>";

struct RenderContext {
  const RenderOptions& options;
  bool has_function_tools = false;
};

void add_special(Pieces& pieces, const char* token) { pieces.push_back(Piece{true, token}); }

void add_text(Pieces& pieces, std::string text) {
  if (!text.empty()) pieces.push_back(Piece{false, std::move(text)});
}

std::string join_sections(const std::vector<std::string>& sections) {
  std::string joined;
  for (const std::string& section : sections) {
    if (!joined.empty()) joined += "\n\n";
    joined += section;
  }
  return joined;
}

std::string render_system_content(const SystemContent& system, const RenderContext& context) {
  std::vector<std::string> sections;
  std::string top;
  for (const auto& line : {system.model_identity,
                           system.knowledge_cutoff ? std::optional("Knowledge cutoff: " + *system.knowledge_cutoff) : std::nullopt,
                           system.conversation_start_date ? std::optional("Current date: " + *system.conversation_start_date)
                                                          : std::nullopt}) {
    if (!line) continue;
    if (!top.empty()) top += '\n';
    top += *line;
  }
  if (!top.empty()) sections.push_back(top);
  if (system.reasoning_effort) {
    sections.push_back("Reasoning: " + std::string(reasoning_effort_name(*system.reasoning_effort)));
  }
  if (system.tools && !system.tools->empty()) sections.push_back(render_tools_section(*system.tools));
  if (system.channel_config && !system.channel_config->valid_channels.empty()) {
    std::string channels = "# Valid channels: ";
    const auto& valid = system.channel_config->valid_channels;
    for (std::size_t i = 0; i < valid.size(); ++i) channels += (i > 0 ? ", " : "") + valid[i];
    channels += ".";
    if (system.channel_config->channel_required) channels += " Channel must be included for every message.";
    if (context.has_function_tools) {
      channels += "\nCalls to these tools must go to the " + context.options.tool_channel + " channel: '" +
                  context.options.tool_namespace + "'.";
    }
    sections.push_back(channels);
  }
  return join_sections(sections);
}

std::string render_developer_content(const DeveloperContent& developer) {
  std::vector<std::string> sections;
  if (developer.instructions) sections.push_back("# Instructions\n\n" + *developer.instructions);
  if (developer.tools && !developer.tools->empty()) sections.push_back(render_tools_section(*developer.tools));
  return join_sections(sections);
}

void render_message_into(Pieces& pieces, const Message& message, const RenderContext& context) {
  add_special(pieces, kStart);
  std::string header;
  if (message.role == Role::Tool && message.name) {
    header = *message.name;
  } else {
    header = role_name(message.role);
    if (message.name) header += ":" + *message.name;
  }
  if (message.recipient) header += " to=" + *message.recipient;
  add_text(pieces, header);
  if (message.channel) {
    add_special(pieces, kChannel);
    add_text(pieces, *message.channel);
  }
  if (message.content_type) {
    const std::string_view constrain = kConstrain;
    if (message.content_type->starts_with(constrain)) {
      add_text(pieces, " ");
      add_special(pieces, kConstrain);
      add_text(pieces, message.content_type->substr(constrain.size()));
    } else {
      add_text(pieces, " " + *message.content_type);
    }
  }
  add_special(pieces, kMessage);
  for (const Content& item : message.content) {
    if (const auto* text = std::get_if<TextContent>(&item)) {
      add_text(pieces, text->text);
    } else if (const auto* system = std::get_if<SystemContent>(&item)) {
      add_text(pieces, render_system_content(*system, context));
    } else {
      add_text(pieces, render_developer_content(std::get<DeveloperContent>(item)));
    }
  }
  add_special(pieces, message.role == Role::Assistant && message.recipient ? kCall : kEnd);
}

bool defines_function_tools(const Conversation& conversation, const std::string& tool_namespace) {
  for (const Message& message : conversation.messages) {
    if (message.role != Role::Developer) continue;
    for (const Content& item : message.content) {
      const auto* developer = std::get_if<DeveloperContent>(&item);
      if (developer == nullptr || !developer->tools) continue;
      auto it = developer->tools->find(tool_namespace);
      if (it != developer->tools->end() && !it->second.tools.empty()) return true;
    }
  }
  return false;
}

// Index below which reasoning messages are dropped (0: drop nothing).
std::size_t analysis_drop_limit(const Conversation& conversation, const RenderOptions& options) {
  if (!options.auto_drop_analysis) return 0;
  const auto& messages = conversation.messages;
  auto last_assistant = std::find_if(messages.rbegin(), messages.rend(),
                                     [](const Message& message) { return message.role == Role::Assistant; });
  if (last_assistant == messages.rend() || last_assistant->channel != options.final_channel) return 0;
  auto first_final = std::find_if(messages.begin(), messages.end(), [&](const Message& message) {
    return message.channel == options.final_channel;
  });
  return static_cast<std::size_t>(first_final - messages.begin());
}

}  // namespace

Pieces render_conversation(const Conversation& conversation, const RenderOptions& options) {
  RenderContext context{options, defines_function_tools(conversation, options.tool_namespace)};
  const std::size_t drop_limit = analysis_drop_limit(conversation, options);
  Pieces pieces;
  for (std::size_t i = 0; i < conversation.messages.size(); ++i) {
    const Message& message = conversation.messages[i];
    if (i < drop_limit && message.channel == options.reasoning_channel) continue;
    render_message_into(pieces, message, context);
  }
  return pieces;
}

Pieces render_for_completion(const Conversation& conversation, Role next_role, const RenderOptions& options) {
  Pieces pieces = render_conversation(conversation, options);
  add_special(pieces, kStart);
  add_text(pieces, std::string(role_name(next_role)));
  return pieces;
}

Pieces render_message(const Message& message, const RenderOptions& options) {
  Pieces pieces;
  render_message_into(pieces, message, RenderContext{options});
  return pieces;
}

std::string pieces_to_text(const Pieces& pieces) {
  std::string text;
  for (const Piece& piece : pieces) text += piece.text;
  return text;
}

std::vector<TokenId> pieces_to_ids(const Pieces& pieces, const Tokenizer& tokenizer) {
  std::vector<TokenId> ids;
  for (const Piece& piece : pieces) {
    if (piece.special) {
      auto id = tokenizer.token_to_id(piece.text);
      require(id.has_value(), "the tokenizer has no special token {} (Harmony needs the o200k_harmony specials)",
              piece.text);
      ids.push_back(*id);
    } else {
      const std::vector<TokenId> encoded = tokenizer.encode(piece.text, false);
      ids.insert(ids.end(), encoded.begin(), encoded.end());
    }
  }
  return ids;
}

}  // namespace beamline::harmony
