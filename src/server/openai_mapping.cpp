#include "server/openai_mapping.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "util/json_fields.h"
#include "util/error.h"

namespace beamline::harmony {

namespace jf = beamline::json_fields;

namespace {

std::string function_name(const std::string& recipient, const HarmonyTemplate& harmony_template) {
  const std::string prefix = harmony_template.tool_namespace + ".";
  return recipient.starts_with(prefix) ? recipient.substr(prefix.size()) : recipient;
}

bool is_function_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// Content is a string or a list of text parts; `allow_null` for assistant messages that only call tools.
std::optional<std::string> text_content(const Json& message, const std::string& where, bool allow_null) {
  const std::string at = jf::path(where, "content");
  const Json* content = jf::find(message, std::string("content"));
  if (content == nullptr) {
    require(allow_null, "{}: missing (a string or a list of text parts is required)", at);
    return std::nullopt;
  }
  if (content->is_string()) return content->get<std::string>();
  require(content->is_array(), "{}: expected a string or a list of content parts, got {}", at, content->type_name());
  std::string text;
  for (std::size_t i = 0; i < content->size(); ++i) {
    const std::string part_at = jf::index_path(at, i);
    const Json& part = (*content)[i];
    jf::expect_object(part, part_at);
    const std::string type = jf::required_string(part, "type", part_at);
    require(type == "text", "{}: content part type '{}' is not supported (only text)", jf::path(part_at, "type"), type);
    text += jf::required_string(part, "text", part_at);
  }
  return text;
}

std::vector<ToolDescription> tools_from_request(const Json& tools, const std::string& where) {
  jf::expect_array(tools, where);
  std::vector<ToolDescription> descriptions;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const std::string at = jf::index_path(where, i);
    const Json& tool = tools[i];
    jf::expect_object(tool, at);
    const std::string type = jf::optional_string(tool, "type", at).value_or("function");
    require(type == "function", "{}: tool type '{}' is not supported (only function)", jf::path(at, "type"), type);
    const std::string function_at = jf::path(at, "function");
    const Json* function = jf::find(tool, std::string("function"));
    require(function != nullptr, "{}: missing", function_at);
    jf::expect_object(*function, function_at);
    ToolDescription description;
    description.name = jf::required_string(*function, "name", function_at);
    require(is_function_name(description.name), "{}: '{}' is not a valid function name (1-64 of a-z, A-Z, 0-9, _, -)",
            jf::path(function_at, "name"), description.name);
    for (const ToolDescription& earlier : descriptions) {
      require(earlier.name != description.name, "{}: function '{}' is defined twice", jf::path(function_at, "name"),
              description.name);
    }
    description.description = jf::optional_string(*function, "description", function_at).value_or("");
    if (const Json* parameters = jf::find(*function, std::string("parameters"))) {
      jf::expect_object(*parameters, jf::path(function_at, "parameters"));
      description.parameters = *parameters;
    }
    descriptions.push_back(std::move(description));
  }
  return descriptions;
}

Message tool_channel_message(const HarmonyTemplate& harmony_template, std::string text) {
  Message message = Message::text(Role::Assistant, std::move(text));
  message.channel = harmony_template.tool_channel;
  return message;
}

// The assistant's turn as Harmony messages; records each tool call's function name by id.
void append_assistant(std::vector<Message>& out, const Json& message, const std::string& where,
                      const HarmonyTemplate& harmony_template, std::map<std::string, std::string>& call_names) {
  std::optional<std::string> reasoning = jf::optional_string(message, "reasoning_content", where);
  if (!reasoning) reasoning = jf::optional_string(message, "reasoning", where);
  std::optional<std::string> content = text_content(message, where, true);
  const Json* tool_calls = jf::find(message, std::string("tool_calls"));
  const bool has_calls = tool_calls != nullptr && !(tool_calls->is_array() && tool_calls->empty());
  require(reasoning || content || has_calls, "{}: an assistant message needs content, tool_calls or reasoning_content",
          where);
  if (reasoning) {
    Message analysis = Message::text(Role::Assistant, *reasoning);
    analysis.channel = harmony_template.reasoning_channel;
    out.push_back(std::move(analysis));
  }
  if (!has_calls) {
    if (content) {
      Message final_message = Message::text(Role::Assistant, *content);
      final_message.channel = harmony_template.final_channel;
      out.push_back(std::move(final_message));
    }
    return;
  }
  if (content && !content->empty()) out.push_back(tool_channel_message(harmony_template, *content));
  const std::string calls_at = jf::path(where, "tool_calls");
  jf::expect_array(*tool_calls, calls_at);
  for (std::size_t i = 0; i < tool_calls->size(); ++i) {
    const std::string at = jf::index_path(calls_at, i);
    const Json& call = (*tool_calls)[i];
    jf::expect_object(call, at);
    const std::string type = jf::optional_string(call, "type", at).value_or("function");
    require(type == "function", "{}: tool call type '{}' is not supported (only function)", jf::path(at, "type"), type);
    const std::string id = jf::required_string(call, "id", at);
    const std::string function_at = jf::path(at, "function");
    const Json* function = jf::find(call, std::string("function"));
    require(function != nullptr, "{}: missing", function_at);
    jf::expect_object(*function, function_at);
    const std::string name = jf::required_string(*function, "name", function_at);
    require(is_function_name(name), "{}: '{}' is not a valid function name", jf::path(function_at, "name"), name);
    const std::string arguments_at = jf::path(function_at, "arguments");
    const Json* arguments = jf::find(*function, std::string("arguments"));
    std::string arguments_text = "{}";
    if (arguments != nullptr) {
      // The API sends a JSON string; an object is unambiguous, so it is accepted too.
      require(arguments->is_string() || arguments->is_object(), "{}: expected a string of JSON, got {}", arguments_at,
              arguments->type_name());
      arguments_text = arguments->is_string() ? arguments->get<std::string>() : arguments->dump();
    }
    Message call_message = tool_channel_message(harmony_template, arguments_text);
    call_message.recipient = harmony_template.tool_namespace + "." + name;
    call_message.content_type = "<|constrain|>json";
    out.push_back(std::move(call_message));
    call_names[id] = name;
  }
}

}  // namespace

OutputField output_field(Role role, const std::optional<std::string>& channel,
                         const std::optional<std::string>& recipient, const HarmonyTemplate& harmony_template) {
  if (role != Role::Assistant) return OutputField::Ignored;
  if (recipient && *recipient != "user" && *recipient != "all") return OutputField::ToolCall;
  if (channel == harmony_template.reasoning_channel) return OutputField::Reasoning;
  return OutputField::Content;
}

Conversation conversation_from_chat_request(const Json& request, const HarmonyTemplate& harmony_template,
                                            const std::string& current_date) {
  jf::expect_object(request, "request");
  std::optional<ReasoningEffort> effort;
  if (auto name = jf::optional_string(request, "reasoning_effort", "")) {
    effort = reasoning_effort_from_name(*name);
    require(effort.has_value(), "reasoning_effort: '{}' is not low, medium or high", *name);
  }
  std::vector<ToolDescription> tools;
  if (const Json* tools_json = jf::find(request, std::string("tools"))) tools = tools_from_request(*tools_json, "tools");

  const Json* messages = jf::find(request, std::string("messages"));
  require(messages != nullptr, "messages: missing (a list of messages is required)");
  jf::expect_array(*messages, "messages");
  require(!messages->empty(), "messages: the list is empty");

  std::vector<std::string> instructions;
  std::vector<Message> turns;
  std::map<std::string, std::string> call_names;
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const std::string where = jf::index_path("messages", i);
    const Json& message = (*messages)[i];
    jf::expect_object(message, where);
    const std::string role = jf::required_string(message, "role", where);
    if (role == "system" || role == "developer") {
      instructions.push_back(*text_content(message, where, false));
    } else if (role == "user") {
      turns.push_back(Message::text(Role::User, *text_content(message, where, false)));
    } else if (role == "assistant") {
      append_assistant(turns, message, where, harmony_template, call_names);
    } else if (role == "tool") {
      const std::string call_id = jf::required_string(message, "tool_call_id", where);
      auto call = call_names.find(call_id);
      require(call != call_names.end(), "{}: no earlier assistant tool call has the id '{}'",
              jf::path(where, "tool_call_id"), call_id);
      Message result = Message::text(Role::Tool, *text_content(message, where, false));
      result.name = harmony_template.tool_namespace + "." + call->second;
      result.recipient = "assistant";
      result.channel = harmony_template.tool_channel;
      turns.push_back(std::move(result));
    } else {
      fail("{}: role '{}' is not supported (system, developer, user, assistant or tool)", jf::path(where, "role"), role);
    }
  }

  Conversation conversation;
  Message system;
  system.role = Role::System;
  system.content.emplace_back(harmony_template.system_content(current_date, effort));
  conversation.messages.push_back(std::move(system));
  if (!instructions.empty() || !tools.empty()) {
    DeveloperContent developer;
    if (!instructions.empty()) {
      std::string joined;
      for (const std::string& text : instructions) joined += (joined.empty() ? "" : "\n\n") + text;
      developer.instructions = std::move(joined);
    }
    if (!tools.empty()) {
      developer.tools = ToolNamespaces{
          {harmony_template.tool_namespace, ToolNamespace{harmony_template.tool_namespace, std::nullopt, tools}}};
    }
    Message developer_message;
    developer_message.role = Role::Developer;
    developer_message.content.emplace_back(std::move(developer));
    conversation.messages.push_back(std::move(developer_message));
  }
  for (Message& turn : turns) conversation.messages.push_back(std::move(turn));
  return conversation;
}

std::string today_utc() {
  const auto today = std::chrono::floor<std::chrono::days>(std::chrono::system_clock::now());
  const std::chrono::year_month_day date{today};
  return fmt::format("{:04}-{:02}-{:02}", static_cast<int>(date.year()), static_cast<unsigned>(date.month()),
                     static_cast<unsigned>(date.day()));
}

std::string new_tool_call_id() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(generator)];
  return id;
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::ToolCalls: return "tool_calls";
    case FinishReason::Length: return "length";
  }
  fail("invalid finish reason value {}", static_cast<int>(reason));
}

FinishReason finish_reason(std::optional<Terminator> last_terminator, bool hit_length_limit) {
  if (hit_length_limit) return FinishReason::Length;
  return last_terminator == Terminator::Call ? FinishReason::ToolCalls : FinishReason::Stop;
}

ChatMessage chat_message_from_harmony(const std::vector<Message>& messages, const HarmonyTemplate& harmony_template) {
  ChatMessage chat;
  auto append = [](std::optional<std::string>& field, const std::string& text) {
    if (text.empty()) return;
    field = field ? *field + "\n" + text : text;
  };
  for (const Message& message : messages) {
    switch (output_field(message.role, message.channel, message.recipient, harmony_template)) {
      case OutputField::Content: append(chat.content, message.text_content()); break;
      case OutputField::Reasoning: append(chat.reasoning_content, message.text_content()); break;
      case OutputField::ToolCall:
        chat.tool_calls.push_back(
            ToolCall{new_tool_call_id(), function_name(*message.recipient, harmony_template), message.text_content()});
        break;
      case OutputField::Ignored: break;
    }
  }
  return chat;
}

Json to_json(const ChatMessage& message) {
  Json json = {{"role", "assistant"}};
  if (message.content) {
    json["content"] = *message.content;
  } else {
    json["content"] = message.tool_calls.empty() ? Json("") : Json(nullptr);
  }
  if (message.reasoning_content) {
    json["reasoning_content"] = *message.reasoning_content;
    json["reasoning"] = *message.reasoning_content;
  }
  if (!message.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCall& call : message.tool_calls) {
      calls.push_back({{"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    json["tool_calls"] = std::move(calls);
  }
  return json;
}

Json to_json(const ChatDelta& delta) {
  Json json = Json::object();
  if (delta.content) json["content"] = *delta.content;
  if (delta.reasoning_content) {
    json["reasoning_content"] = *delta.reasoning_content;
    json["reasoning"] = *delta.reasoning_content;
  }
  if (delta.tool_call) {
    Json call = {{"index", delta.tool_call->index}};
    if (delta.tool_call->id) {
      call["id"] = *delta.tool_call->id;
      call["type"] = "function";
    }
    Json function = Json::object();
    if (delta.tool_call->name) function["name"] = *delta.tool_call->name;
    function["arguments"] = delta.tool_call->arguments;
    call["function"] = std::move(function);
    json["tool_calls"] = Json::array({std::move(call)});
  }
  return json;
}

ChatStreamMapper::ChatStreamMapper(const HarmonyTemplate& harmony_template) : template_(harmony_template) {}

std::optional<ChatDelta> ChatStreamMapper::on_event(const ParseEvent& event) {
  const MessageHeader& header = event.header;
  switch (event.kind) {
    case ParseEvent::Kind::MessageStart: {
      message_has_text_ = false;
      current_ = output_field(header.role, header.channel, header.recipient, template_);
      if (current_ != OutputField::ToolCall) return std::nullopt;
      ChatDelta delta;
      delta.tool_call = ToolCallDelta{tool_calls_, new_tool_call_id(), function_name(*header.recipient, template_), ""};
      ++tool_calls_;
      return delta;
    }
    case ParseEvent::Kind::ContentDelta: {
      if (event.text.empty() || current_ == OutputField::Ignored) return std::nullopt;
      ChatDelta delta;
      if (current_ == OutputField::ToolCall) {
        delta.tool_call = ToolCallDelta{tool_calls_ - 1, std::nullopt, std::nullopt, event.text};
        return delta;
      }
      // The same "\n" that joins two messages of one field in chat_message_from_harmony.
      bool& started = current_ == OutputField::Content ? content_started_ : reasoning_started_;
      std::string text = started && !message_has_text_ ? "\n" + event.text : event.text;
      started = true;
      message_has_text_ = true;
      (current_ == OutputField::Content ? delta.content : delta.reasoning_content) = std::move(text);
      return delta;
    }
    case ParseEvent::Kind::MessageEnd: current_ = OutputField::Ignored; return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace beamline::harmony
