#pragma once
// Between the OpenAI Chat Completions API and Harmony (HARMONY.md's mapping table), for the server.
//
// Requests: parse the body with nlohmann::ordered_json, not nlohmann::json: the order of a tool's parameter
// properties is part of the prompt, and nlohmann::json would sort them.
#include <optional>
#include <string>
#include <vector>

#include "harmony/harmony_message.h"
#include "harmony/harmony_parser.h"
#include "harmony/harmony_template.h"

namespace beamline::harmony {

// Chat Completions `messages` + `tools` + `reasoning_effort` (other request fields are ignored here) →
// a conversation: a system message from the template, `current_date` and the effort; one developer message
// holding the client's system/developer texts as `# Instructions` and the tools as the template's namespace;
// then user / assistant / tool messages. Assistant `reasoning_content` (or `reasoning`) becomes an analysis
// message, `tool_calls` become tool-channel messages to `<namespace>.<name>`, `content` the final answer (a
// preamble on the tool channel when tool calls follow). A `tool` message's function comes from the earlier
// assistant tool call with its `tool_call_id`.
// A request of the wrong shape throws beamline::Error naming the field, e.g. "messages[2].tool_call_id: ...".
Conversation conversation_from_chat_request(const Json& request, const HarmonyTemplate& harmony_template,
                                            const std::string& current_date);

// Today's date in UTC as YYYY-MM-DD (the system message's "Current date").
std::string today_utc();

// "call_" followed by 24 random letters and digits.
std::string new_tool_call_id();

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the JSON text the model wrote
};

struct ChatMessage {
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;
};

// Which response field an assistant message feeds: reasoning channel → reasoning_content, a recipient
// (other than the user) → tool_calls, anything else → content; messages of other roles are ignored.
enum class OutputField { Content, Reasoning, ToolCall, Ignored };
OutputField output_field(Role role, const std::optional<std::string>& channel,
                         const std::optional<std::string>& recipient, const HarmonyTemplate& harmony_template);

enum class FinishReason { Stop, ToolCalls, Length };
std::string_view finish_reason_name(FinishReason reason);  // "stop", "tool_calls", "length"
// <|call|> → tool_calls, <|return|> (or any other end) → stop, the token limit → length.
FinishReason finish_reason(std::optional<Terminator> last_terminator, bool hit_length_limit);

// Parsed assistant output → the response message: reasoning channel → reasoning_content, a message with
// a recipient → a tool call (the namespace prefix removed from the name), everything else → content.
// Several messages feeding one field are joined with "\n".
ChatMessage chat_message_from_harmony(const std::vector<Message>& messages, const HarmonyTemplate& harmony_template);
// {"role": "assistant", "content": ..., "reasoning_content": ..., "reasoning": ..., "tool_calls": [...]}
Json to_json(const ChatMessage& message);

struct ToolCallDelta {
  std::size_t index = 0;
  std::optional<std::string> id;    // first delta of a call only
  std::optional<std::string> name;  // first delta of a call only
  std::string arguments;
};

struct ChatDelta {
  std::optional<std::string> content;
  std::optional<std::string> reasoning_content;
  std::optional<ToolCallDelta> tool_call;
};
// A Chat Completions chunk's `delta` object.
Json to_json(const ChatDelta& delta);

// Streaming: parser events → chunk deltas, consistent with chat_message_from_harmony on the same output.
class ChatStreamMapper {
 public:
  explicit ChatStreamMapper(const HarmonyTemplate& harmony_template);
  // The delta an event produces, if any.
  std::optional<ChatDelta> on_event(const ParseEvent& event);
  std::size_t tool_call_count() const { return tool_calls_; }

 private:
  const HarmonyTemplate& template_;
  OutputField current_ = OutputField::Ignored;
  bool message_has_text_ = false;
  bool content_started_ = false;
  bool reasoning_started_ = false;
  std::size_t tool_calls_ = 0;
};

}  // namespace beamline::harmony
