// OpenAI Chat Completions ↔ Harmony: requests to conversations (and their rendered prompts), request
// shape errors naming the field, parsed output to message fields and finish reasons, and the streaming
// mapper agreeing with the non-streaming one.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <set>

#include "../harmony/harmony_fake_tokenizer.h"
#include "../harmony/harmony_test_support.h"
#include "server/openai_mapping.h"
#include "util/error.h"

namespace beamline::harmony {
namespace {

using testing::ByteTokenizer;

Json weather_tool() {
  return Json::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",
    "enum": ["c", "f"]}}, "required": ["city"]}}})");
}

TEST(OpenAIMapping, RequestBecomesTheHarmonyPrompt) {
  Json request = Json::parse(R"({
    "reasoning_effort": "high",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "reasoning_content": "Need the tool.", "content": null,
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "{\"temp\": 20}"}]},
      {"role": "developer", "content": "Use metric units."}
    ]})");
  request["tools"] = Json::array({weather_tool()});
  HarmonyTemplate harmony_template;
  harmony_template.model_identity = "You are Beam.";
  harmony_template.knowledge_cutoff = "2026-06";
  const Conversation conversation = conversation_from_chat_request(request, harmony_template, "2026-11-30");
  const std::string prompt =
      pieces_to_text(render_for_completion(conversation, Role::Assistant, harmony_template.render_options()));
  const std::string expected =
      "<|start|>system<|message|>You are Beam.\nKnowledge cutoff: 2026-06\nCurrent date: 2026-11-30\n\n"
      "Reasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
      "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
      "<|start|>developer<|message|># Instructions\n\nBe brief.\n\nUse metric units.\n\n# Tools\n\n## functions\n\n"
      "namespace functions {\n\n// Weather now.\ntype get_weather = (_: {\ncity: string,\nunit?: \"c\" | \"f\",\n}) => any;"
      "\n\n} // namespace functions<|end|>"
      "<|start|>user<|message|>Weather in Paris?<|end|>"
      "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
      "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
      "{\"city\": \"Paris\"}<|call|>"
      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 20}<|end|>"
      "<|start|>assistant";
  EXPECT_EQ(prompt, expected);
}

TEST(OpenAIMapping, CompletedTurnsDropTheirReasoning) {
  const Json request = Json::parse(R"({"messages": [
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "reasoning_content": "easy", "content": "4"},
      {"role": "user", "content": "3+3?"}]})");
  HarmonyTemplate harmony_template;
  const Conversation conversation = conversation_from_chat_request(request, harmony_template, "");
  ASSERT_EQ(conversation.messages.size(), 5u);  // system, user, analysis, final, user
  EXPECT_EQ(conversation.messages[2].channel, "analysis");
  EXPECT_EQ(conversation.messages[3].channel, "final");
  const std::string prompt =
      pieces_to_text(render_for_completion(conversation, Role::Assistant, harmony_template.render_options()));
  EXPECT_EQ(prompt.find("easy"), std::string::npos);
  EXPECT_NE(prompt.find("<|start|>assistant<|channel|>final<|message|>4<|end|>"), std::string::npos);
  EXPECT_EQ(prompt.find("Current date"), std::string::npos);
  EXPECT_NE(prompt.find("Reasoning: medium"), std::string::npos);
}

TEST(OpenAIMapping, PreambleBeforeToolCallsGoesToTheToolChannel) {
  const Json request = Json::parse(R"({"messages": [{"role": "user", "content": "hi"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": {"x": 1}}},
        {"id": "b", "function": {"name": "g"}}]},
      {"role": "tool", "tool_call_id": "b", "content": "ok"}]})");
  const Conversation conversation = conversation_from_chat_request(request, HarmonyTemplate{}, "");
  ASSERT_EQ(conversation.messages.size(), 6u);
  EXPECT_EQ(conversation.messages[2].channel, "commentary");
  EXPECT_FALSE(conversation.messages[2].recipient.has_value());
  EXPECT_EQ(conversation.messages[3].recipient, "functions.f");
  EXPECT_EQ(conversation.messages[3].text_content(), R"({"x":1})");
  EXPECT_EQ(conversation.messages[4].recipient, "functions.g");
  EXPECT_EQ(conversation.messages[4].text_content(), "{}");
  EXPECT_EQ(conversation.messages[5].role, Role::Tool);
  EXPECT_EQ(conversation.messages[5].name, "functions.g");
}

TEST(OpenAIMapping, TemplateNamesTheChannelsAndNamespace) {
  HarmonyTemplate harmony_template;
  harmony_template.channels = {"think", "tools", "answer"};
  harmony_template.reasoning_channel = "think";
  harmony_template.tool_channel = "tools";
  harmony_template.final_channel = "answer";
  harmony_template.tool_namespace = "fn";
  Json request = Json::parse(R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "reasoning": "r", "tool_calls": [{"id": "1", "function": {"name": "get_weather", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "y"}]})");
  request["tools"] = Json::array({weather_tool()});
  const std::string prompt = pieces_to_text(render_for_completion(
      conversation_from_chat_request(request, harmony_template, ""), Role::Assistant, harmony_template.render_options()));
  EXPECT_NE(prompt.find("# Valid channels: think, tools, answer."), std::string::npos);
  EXPECT_NE(prompt.find("Calls to these tools must go to the tools channel: 'fn'."), std::string::npos);
  EXPECT_NE(prompt.find("namespace fn {"), std::string::npos);
  EXPECT_NE(prompt.find("<|start|>assistant<|channel|>think<|message|>r<|end|>"), std::string::npos);
  EXPECT_NE(prompt.find("<|start|>assistant to=fn.get_weather<|channel|>tools"), std::string::npos);
  EXPECT_NE(prompt.find("<|start|>fn.get_weather to=assistant<|channel|>tools<|message|>y"), std::string::npos);
}

struct BadRequest {
  std::string body;
  std::string field;
};

TEST(OpenAIMapping, BadRequestsNameTheField) {
  const std::vector<BadRequest> cases = {
      {R"({})", "messages"},
      {R"({"messages": {}})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [1]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "function", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]})", "messages[1]"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]})", "messages[1].tool_call_id"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "y"}]})",
       "messages[1].tool_call_id"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]})",
       "messages[0].tool_calls[0].id"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]})", "messages[0].tool_calls[0].function"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "a b"}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": 3}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "assistant", "tool_calls": 7}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": 2})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})", "tools[0].type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0].function"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "bad name"}}]})",
       "tools[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f", "parameters": []}}]})",
       "tools[0].function.parameters"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}, {"function": {"name": "f"}}]})",
       "tools[1].function.name"},
  };
  for (const BadRequest& test : cases) {
    try {
      conversation_from_chat_request(Json::parse(test.body), HarmonyTemplate{}, "");
      ADD_FAILURE() << "no error for " << test.body;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind(test.field + ":", 0), 0u) << test.body << " -> " << message;
    }
  }
}

TEST(OpenAIMapping, ToolCallIdsAreUniqueAndWellFormed) {
  const std::regex form("call_[A-Za-z0-9]{24}");
  std::set<std::string> ids;
  for (int i = 0; i < 10000; ++i) {
    std::string id = new_tool_call_id();
    ASSERT_TRUE(std::regex_match(id, form)) << id;
    ids.insert(std::move(id));
  }
  EXPECT_EQ(ids.size(), 10000u);
}

TEST(OpenAIMapping, FinishReasons) {
  EXPECT_EQ(finish_reason_name(finish_reason(Terminator::Call, false)), "tool_calls");
  EXPECT_EQ(finish_reason_name(finish_reason(Terminator::Return, false)), "stop");
  EXPECT_EQ(finish_reason_name(finish_reason(Terminator::End, false)), "stop");
  EXPECT_EQ(finish_reason_name(finish_reason(std::nullopt, false)), "stop");
  EXPECT_EQ(finish_reason_name(finish_reason(Terminator::Call, true)), "length");
  EXPECT_EQ(finish_reason_name(finish_reason(std::nullopt, true)), "length");
}

TEST(OpenAIMapping, Today) { EXPECT_TRUE(std::regex_match(today_utc(), std::regex(R"(20\d\d-[01]\d-[0-3]\d)"))); }

// Random model output: reasoning, preambles, tool calls (on either channel), final answers.
std::vector<Message> random_output(std::mt19937& rng) {
  static const std::vector<std::string> texts = {"", "a", "think 中文", "😀 ok", "{\"x\": [1, 2]}", "line\nbreak"};
  std::vector<Message> messages;
  for (int i = std::uniform_int_distribution<int>(1, 6)(rng); i > 0; --i) {
    Message message = Message::text(Role::Assistant, texts[std::uniform_int_distribution<std::size_t>(0, texts.size() - 1)(rng)]);
    switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
      case 0: message.channel = "analysis"; break;
      case 1: message.channel = "final"; break;
      case 2: message.channel = "commentary"; break;
      case 3: message.channel = "commentary"; message.recipient = "functions.lookup"; message.content_type = "<|constrain|>json"; break;
      default: message.channel = "analysis"; message.recipient = "browser.search"; break;
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

// The rule from HARMONY.md, written out plainly.
ChatMessage reference_chat_message(const std::vector<Message>& messages) {
  ChatMessage chat;
  for (const Message& message : messages) {
    const std::string text = message.text_content();
    if (message.recipient) {
      const std::string name = message.recipient->starts_with("functions.") ? message.recipient->substr(10) : *message.recipient;
      chat.tool_calls.push_back(ToolCall{"", name, text});
    } else if (!text.empty()) {
      auto& field = message.channel == "analysis" ? chat.reasoning_content : chat.content;
      field = field ? *field + "\n" + text : text;
    }
  }
  return chat;
}

TEST(OpenAIMapping, OutputMessagesMatchTheReferenceAndTheStream) {
  const ByteTokenizer tokenizer;
  const HarmonyTemplate harmony_template;
  for (unsigned seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(seed);
    const std::vector<Message> output = random_output(rng);
    const ChatMessage chat = chat_message_from_harmony(output, harmony_template);
    const ChatMessage reference = reference_chat_message(output);
    ASSERT_EQ(chat.content, reference.content) << "seed " << seed;
    ASSERT_EQ(chat.reasoning_content, reference.reasoning_content) << "seed " << seed;
    ASSERT_EQ(chat.tool_calls.size(), reference.tool_calls.size()) << "seed " << seed;
    for (std::size_t i = 0; i < chat.tool_calls.size(); ++i) {
      EXPECT_EQ(chat.tool_calls[i].name, reference.tool_calls[i].name);
      EXPECT_EQ(chat.tool_calls[i].arguments, reference.tool_calls[i].arguments);
    }

    // The same output streamed: render as the model would write it (after "<|start|>assistant").
    Conversation conversation{output};
    RenderOptions keep;
    keep.auto_drop_analysis = false;
    std::vector<TokenId> ids = pieces_to_ids(render_conversation(conversation, keep), tokenizer);
    ids.erase(ids.begin(), ids.begin() + 1 + static_cast<std::ptrdiff_t>(std::string("assistant").size()));
    StreamingParser parser(tokenizer, ParserOptions{Role::Assistant});
    ChatStreamMapper mapper(harmony_template);
    std::string content, reasoning;
    std::vector<ToolCall> calls;
    auto apply = [&](const std::vector<ParseEvent>& events) {
      for (const ParseEvent& event : events) {
        auto delta = mapper.on_event(event);
        if (!delta) continue;
        if (delta->content) content += *delta->content;
        if (delta->reasoning_content) reasoning += *delta->reasoning_content;
        if (delta->tool_call) {
          if (delta->tool_call->id) {
            ASSERT_EQ(delta->tool_call->index, calls.size());
            calls.push_back(ToolCall{*delta->tool_call->id, *delta->tool_call->name, ""});
          }
          calls.at(delta->tool_call->index).arguments += delta->tool_call->arguments;
        }
      }
    };
    for (TokenId id : ids) apply(parser.push(id));
    apply(parser.finish());
    EXPECT_EQ(content, chat.content.value_or("")) << "seed " << seed;
    EXPECT_EQ(reasoning, chat.reasoning_content.value_or("")) << "seed " << seed;
    ASSERT_EQ(calls.size(), chat.tool_calls.size()) << "seed " << seed;
    EXPECT_EQ(mapper.tool_call_count(), calls.size());
    for (std::size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].name, chat.tool_calls[i].name);
      EXPECT_EQ(calls[i].arguments, chat.tool_calls[i].arguments);
    }
  }
}

TEST(OpenAIMapping, ResponseJsonShape) {
  ChatMessage chat;
  chat.reasoning_content = "r";
  chat.tool_calls.push_back(ToolCall{"call_x", "f", "{}"});
  const Json json = to_json(chat);
  EXPECT_EQ(json["role"], "assistant");
  EXPECT_TRUE(json["content"].is_null());
  EXPECT_EQ(json["reasoning_content"], "r");
  EXPECT_EQ(json["tool_calls"][0]["id"], "call_x");
  EXPECT_EQ(json["tool_calls"][0]["type"], "function");
  EXPECT_EQ(json["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(json["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(to_json(ChatMessage{})["content"], "");

  ChatDelta delta;
  delta.tool_call = ToolCallDelta{2, "call_y", "g", ""};
  const Json delta_json = to_json(delta);
  EXPECT_EQ(delta_json["tool_calls"][0]["index"], 2);
  EXPECT_EQ(delta_json["tool_calls"][0]["id"], "call_y");
  EXPECT_EQ(delta_json["tool_calls"][0]["function"]["name"], "g");
  EXPECT_FALSE(delta_json.contains("content"));
}

}  // namespace
}  // namespace beamline::harmony
