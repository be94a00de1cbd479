#pragma once
// Harmony conversation model: messages, their content items, and tool descriptions, with the JSON form
// Harmony itself uses (`Message.to_dict()` in openai/harmony; see tests/data/harmony/README.md).
//
// JSON is nlohmann::ordered_json throughout because the properties of a tool's JSON schema are rendered
// in insertion order: parsing them into a sorted map would change the prompt.
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace beamline::harmony {

using Json = nlohmann::ordered_json;

enum class Role { System, Developer, User, Assistant, Tool };
std::string_view role_name(Role role);
std::optional<Role> role_from_name(std::string_view name);

enum class ReasoningEffort { Low, Medium, High };
// "low" / "medium" / "high"; the form rendered into the system message and used by the OpenAI API.
std::string_view reasoning_effort_name(ReasoningEffort effort);
// Accepts any letter case ("Medium" in Harmony's JSON, "medium" in the OpenAI API).
std::optional<ReasoningEffort> reasoning_effort_from_name(std::string_view name);

struct ToolDescription {
  std::string name;
  std::string description;
  std::optional<Json> parameters;  // a JSON schema; absent means the tool takes no arguments
};

struct ToolNamespace {
  std::string name;
  std::optional<std::string> description;
  std::vector<ToolDescription> tools;
};

// Keyed and rendered by namespace name, in sorted order (Harmony keeps them in a sorted map).
using ToolNamespaces = std::map<std::string, ToolNamespace>;

struct ChannelConfig {
  std::vector<std::string> valid_channels;
  bool channel_required = true;
};

struct SystemContent {
  std::optional<std::string> model_identity;
  std::optional<ReasoningEffort> reasoning_effort;
  std::optional<std::string> conversation_start_date;
  std::optional<std::string> knowledge_cutoff;
  std::optional<ChannelConfig> channel_config;
  std::optional<ToolNamespaces> tools;
};

struct DeveloperContent {
  std::optional<std::string> instructions;
  std::optional<ToolNamespaces> tools;
};

struct TextContent {
  std::string text;
};

using Content = std::variant<TextContent, SystemContent, DeveloperContent>;

struct Message {
  Role role = Role::User;
  std::optional<std::string> name;  // author name; for a tool result, the tool (e.g. "functions.get_weather")
  std::vector<Content> content;
  std::optional<std::string> channel;
  std::optional<std::string> recipient;
  std::optional<std::string> content_type;

  static Message text(Role role, std::string text);
  // The concatenation of the text items (system and developer content contribute nothing).
  std::string text_content() const;
};

struct Conversation {
  std::vector<Message> messages;
};

// JSON readers: `where` prefixes every error message (e.g. "conversation.json: messages[2]") so the
// error names the exact field. Both of Harmony's forms are read: content as a list of items or as a
// plain string, and `name` null or absent.
Message message_from_json(const Json& json, const std::string& where);
Conversation conversation_from_json(const Json& json, const std::string& where);
std::vector<Message> messages_from_json(const Json& json, const std::string& where);

// JSON writers produce Harmony's `to_dict()` form: `name` always present (null when unset), content as
// a list, and channel / recipient / content_type only when set.
Json to_json(const Message& message);
Json to_json(const Conversation& conversation);
Json to_json(const std::vector<Message>& messages);

}  // namespace beamline::harmony
