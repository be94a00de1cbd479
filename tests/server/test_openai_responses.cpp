// The Responses API request mapped onto the chat path: input items, instructions, flat function tools,
// tool_choice, reasoning and text.format become the Chat Completions body; shapes the mapping cannot carry are
// 400s naming the Responses field (or a path inside it, e.g. input[0].call_id).
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/openai_responses.h"

namespace beamline::server {
namespace {

ApiError error_of(const std::string& body) {
  try {
    chat_body_from_responses_request(Json::parse(body));
  } catch (...) {
    return to_api_error(std::current_exception());
  }
  ADD_FAILURE() << "no error for " << body;
  return internal_error("no error");
}

TEST(ResponsesRequest, StringInputAndInstructions) {
  const Json chat = chat_body_from_responses_request(Json::parse(
      R"({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0.5,
          "top_p": 0.9, "reasoning": {"effort": "low"}, "stream": true, "store": true})"));
  EXPECT_EQ(chat, Json::parse(R"({"model": "m", "temperature": 0.5, "top_p": 0.9, "stream": true,
      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
      "max_tokens": 16, "reasoning_effort": "low"})"));
}

TEST(ResponsesRequest, ItemsOfOneAssistantTurnBecomeOneAssistantMessage) {
  const Json chat = chat_body_from_responses_request(Json::parse(R"({"input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 20}"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "20 C."}]},
      {"role": "developer", "content": "Use metric units."}],
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather now.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}}})"));
  EXPECT_EQ(chat["messages"], Json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "reasoning_content": "Need the tool.", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 20}"},
      {"role": "assistant", "content": "20 C."},
      {"role": "developer", "content": "Use metric units."}])"));
  EXPECT_EQ(chat["tools"], Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather now.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"));
  EXPECT_EQ(chat["tool_choice"], Json::parse(R"({"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(chat["response_format"], Json::parse(R"({"type": "json_schema", "json_schema": {"name": "w",
      "schema": {"type": "object"}, "strict": true}})"));
}

TEST(ResponsesRequest, UnsupportedShapesAre400NamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})", "input"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input"},
      {R"({"input": [{"type": "item_reference", "id": "x"}]})", "input"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input"},
      {R"({"input": "x", "instructions": 3})", "instructions"},
      {R"({"input": "x", "tools": [{"type": "web_search_preview"}]})", "tools"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools"},
      {R"({"input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice"},
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id"},
      {R"({"input": "x", "background": true})", "background"},
      {R"({"input": "x", "reasoning": "high"})", "reasoning"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError error = error_of(body);
    EXPECT_EQ(error.status(), 400) << body;
    EXPECT_TRUE(error.param().value_or("<none>").starts_with(param)) << body << ": " << error.param().value_or("<none>")
                                                                     << ": " << error.what();
  }
}

TEST(ResponsesRequest, ItemIdsHaveOpenAIsShape) {
  const std::string id = new_item_id("resp");
  EXPECT_TRUE(id.starts_with("resp_")) << id;
  EXPECT_EQ(id.size(), 5u + 32u);
  EXPECT_NE(id, new_item_id("resp"));
}

}  // namespace
}  // namespace beamline::server
