#include "harmony/harmony_message.h"

#include <algorithm>
#include <cctype>

#include "util/json_fields.h"
#include "util/error.h"

namespace beamline::harmony {

namespace jf = beamline::json_fields;

namespace {

constexpr std::pair<Role, std::string_view> kRoleNames[] = {
    {Role::System, "system"}, {Role::Developer, "developer"}, {Role::User, "user"},
    {Role::Assistant, "assistant"}, {Role::Tool, "tool"}};

std::string lowercase(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower;
}

// Harmony's JSON writes efforts capitalised ("Medium"), as its Python/Rust enums print them.
std::string capitalised_effort(ReasoningEffort effort) {
  std::string name(reasoning_effort_name(effort));
  name[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(name[0])));
  return name;
}

ToolDescription tool_from_json(const Json& json, const std::string& where) {
  jf::expect_object(json, where);
  ToolDescription tool;
  tool.name = jf::required_string(json, "name", where);
  tool.description = jf::optional_string(json, "description", where).value_or("");
  if (const Json* parameters = jf::find(json, std::string("parameters"))) {
    jf::expect_object(*parameters, jf::path(where, "parameters"));
    tool.parameters = *parameters;
  }
  return tool;
}

ToolNamespaces namespaces_from_json(const Json& json, const std::string& where) {
  jf::expect_object(json, where);
  ToolNamespaces namespaces;
  for (const auto& [key, value] : json.items()) {
    const std::string at = jf::path(where, key);
    jf::expect_object(value, at);
    ToolNamespace ns;
    ns.name = jf::optional_string(value, "name", at).value_or(key);
    ns.description = jf::optional_string(value, "description", at);
    if (const Json* tools = jf::find(value, std::string("tools"))) {
      jf::expect_array(*tools, jf::path(at, "tools"));
      for (std::size_t i = 0; i < tools->size(); ++i) {
        ns.tools.push_back(tool_from_json((*tools)[i], jf::index_path(jf::path(at, "tools"), i)));
      }
    }
    namespaces.emplace(key, std::move(ns));
  }
  return namespaces;
}

std::optional<ReasoningEffort> effort_from_json(const Json& json, const std::string& where) {
  auto name = jf::optional_string(json, "reasoning_effort", where);
  if (!name) return std::nullopt;
  auto effort = reasoning_effort_from_name(*name);
  require(effort.has_value(), "{}: '{}' is not a reasoning effort (Low, Medium or High)",
          jf::path(where, "reasoning_effort"), *name);
  return effort;
}

Content content_from_json(const Json& json, const std::string& where) {
  jf::expect_object(json, where);
  const std::string type = jf::required_string(json, "type", where);
  if (type == "text") return TextContent{jf::required_string(json, "text", where)};
  if (type == "system_content") {
    SystemContent system;
    system.model_identity = jf::optional_string(json, "model_identity", where);
    system.reasoning_effort = effort_from_json(json, where);
    system.conversation_start_date = jf::optional_string(json, "conversation_start_date", where);
    system.knowledge_cutoff = jf::optional_string(json, "knowledge_cutoff", where);
    if (const Json* channels = jf::find(json, std::string("channel_config"))) {
      const std::string at = jf::path(where, "channel_config");
      jf::expect_object(*channels, at);
      ChannelConfig config;
      if (const Json* valid = jf::find(*channels, std::string("valid_channels"))) {
        config.valid_channels = jf::string_array(*valid, jf::path(at, "valid_channels"));
      }
      config.channel_required = jf::optional_bool(*channels, "channel_required", at).value_or(true);
      system.channel_config = std::move(config);
    }
    if (const Json* tools = jf::find(json, std::string("tools"))) {
      system.tools = namespaces_from_json(*tools, jf::path(where, "tools"));
    }
    return system;
  }
  if (type == "developer_content") {
    DeveloperContent developer;
    developer.instructions = jf::optional_string(json, "instructions", where);
    if (const Json* tools = jf::find(json, std::string("tools"))) {
      developer.tools = namespaces_from_json(*tools, jf::path(where, "tools"));
    }
    return developer;
  }
  fail("{}: unknown content type '{}' (expected text, system_content or developer_content)",
       jf::path(where, "type"), type);
}

Json namespaces_to_json(const ToolNamespaces& namespaces) {
  Json json = Json::object();
  for (const auto& [key, ns] : namespaces) {
    Json tools = Json::array();
    for (const ToolDescription& tool : ns.tools) {
      Json entry = {{"name", tool.name}, {"description", tool.description}};
      if (tool.parameters) entry["parameters"] = *tool.parameters;
      tools.push_back(std::move(entry));
    }
    Json ns_json = {{"name", ns.name}};
    if (ns.description) ns_json["description"] = *ns.description;
    ns_json["tools"] = std::move(tools);
    json[key] = std::move(ns_json);
  }
  return json;
}

Json content_to_json(const Content& content) {
  if (const auto* text = std::get_if<TextContent>(&content)) return Json{{"type", "text"}, {"text", text->text}};
  Json json = Json::object();
  if (const auto* system = std::get_if<SystemContent>(&content)) {
    if (system->model_identity) json["model_identity"] = *system->model_identity;
    if (system->reasoning_effort) json["reasoning_effort"] = capitalised_effort(*system->reasoning_effort);
    if (system->conversation_start_date) json["conversation_start_date"] = *system->conversation_start_date;
    if (system->knowledge_cutoff) json["knowledge_cutoff"] = *system->knowledge_cutoff;
    if (system->channel_config) {
      json["channel_config"] = {{"valid_channels", system->channel_config->valid_channels},
                                {"channel_required", system->channel_config->channel_required}};
    }
    if (system->tools) json["tools"] = namespaces_to_json(*system->tools);
    json["type"] = "system_content";
    return json;
  }
  const auto& developer = std::get<DeveloperContent>(content);
  if (developer.instructions) json["instructions"] = *developer.instructions;
  if (developer.tools) json["tools"] = namespaces_to_json(*developer.tools);
  json["type"] = "developer_content";
  return json;
}

}  // namespace

std::string_view role_name(Role role) {
  for (const auto& [value, name] : kRoleNames) {
    if (value == role) return name;
  }
  fail("invalid Harmony role value {}", static_cast<int>(role));
}

std::optional<Role> role_from_name(std::string_view name) {
  for (const auto& [value, role_text] : kRoleNames) {
    if (role_text == name) return value;
  }
  return std::nullopt;
}

std::string_view reasoning_effort_name(ReasoningEffort effort) {
  switch (effort) {
    case ReasoningEffort::Low: return "low";
    case ReasoningEffort::Medium: return "medium";
    case ReasoningEffort::High: return "high";
  }
  fail("invalid reasoning effort value {}", static_cast<int>(effort));
}

std::optional<ReasoningEffort> reasoning_effort_from_name(std::string_view name) {
  const std::string lower = lowercase(name);
  for (ReasoningEffort effort : {ReasoningEffort::Low, ReasoningEffort::Medium, ReasoningEffort::High}) {
    if (lower == reasoning_effort_name(effort)) return effort;
  }
  return std::nullopt;
}

Message Message::text(Role role, std::string text) {
  Message message;
  message.role = role;
  message.content.emplace_back(TextContent{std::move(text)});
  return message;
}

std::string Message::text_content() const {
  std::string text;
  for (const Content& item : content) {
    if (const auto* piece = std::get_if<TextContent>(&item)) text += piece->text;
  }
  return text;
}

Message message_from_json(const Json& json, const std::string& where) {
  jf::expect_object(json, where);
  Message message;
  const std::string role = jf::required_string(json, "role", where);
  auto parsed_role = role_from_name(role);
  require(parsed_role.has_value(), "{}: unknown role '{}' (expected system, developer, user, assistant or tool)",
          jf::path(where, "role"), role);
  message.role = *parsed_role;
  message.name = jf::optional_string(json, "name", where);
  const std::string content_at = jf::path(where, "content");
  const Json* content = jf::find(json, std::string("content"));
  require(content != nullptr, "{}: missing (a string or a list of content items is required)", content_at);
  if (content->is_string()) {
    message.content.emplace_back(TextContent{content->get<std::string>()});
  } else {
    require(content->is_array(), "{}: expected a string or a list of content items, got {}", content_at,
            content->type_name());
    for (std::size_t i = 0; i < content->size(); ++i) {
      message.content.push_back(content_from_json((*content)[i], jf::index_path(content_at, i)));
    }
  }
  message.channel = jf::optional_string(json, "channel", where);
  message.recipient = jf::optional_string(json, "recipient", where);
  message.content_type = jf::optional_string(json, "content_type", where);
  return message;
}

std::vector<Message> messages_from_json(const Json& json, const std::string& where) {
  jf::expect_array(json, where);
  std::vector<Message> messages;
  for (std::size_t i = 0; i < json.size(); ++i) messages.push_back(message_from_json(json[i], jf::index_path(where, i)));
  return messages;
}

Conversation conversation_from_json(const Json& json, const std::string& where) {
  jf::expect_object(json, where);
  const Json* messages = jf::find(json, std::string("messages"));
  require(messages != nullptr, "{}: missing (a list of messages is required)", jf::path(where, "messages"));
  return Conversation{messages_from_json(*messages, jf::path(where, "messages"))};
}

Json to_json(const Message& message) {
  Json json = {{"role", role_name(message.role)}};
  json["name"] = message.name ? Json(*message.name) : Json(nullptr);
  Json content = Json::array();
  for (const Content& item : message.content) content.push_back(content_to_json(item));
  json["content"] = std::move(content);
  if (message.channel) json["channel"] = *message.channel;
  if (message.recipient) json["recipient"] = *message.recipient;
  if (message.content_type) json["content_type"] = *message.content_type;
  return json;
}

Json to_json(const std::vector<Message>& messages) {
  Json json = Json::array();
  for (const Message& message : messages) json.push_back(to_json(message));
  return json;
}

Json to_json(const Conversation& conversation) { return Json{{"messages", to_json(conversation.messages)}}; }

}  // namespace beamline::harmony
