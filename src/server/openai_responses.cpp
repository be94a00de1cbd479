#include "server/openai_responses.h"

#include <fmt/format.h>

#include <set>
#include <tuple>
#include <utility>

#include "server/request_fields.h"

namespace beamline::server {

namespace {

// Sampling and bookkeeping fields the chat path reads under the same name (vLLM's extensions included).
constexpr const char* kSharedFields[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                         "frequency_penalty", "repetition_penalty", "stream", "cache_salt", "user"};

// Chat field → the Responses field a client wrote, for errors the chat path raises.
constexpr std::pair<const char*, const char*> kRenamedFields[] = {{"max_completion_tokens", "max_output_tokens"},
                                                                  {"max_tokens", "max_output_tokens"},
                                                                  {"messages", "input"},
                                                                  {"prompt", "input"},
                                                                  {"reasoning_effort", "reasoning.effort"},
                                                                  {"response_format", "text.format"}};

std::string at(const std::string& where, std::size_t index) { return fmt::format("{}[{}]", where, index); }

std::string required_text(const Json& object, const std::string& key, const std::string& where) {
  const Json* value = find_field(object, key);
  if (value == nullptr || !value->is_string()) {
    throw invalid_request(where + "." + key, fmt::format("{}.{}: {} (a string is required)", where, key,
                                             value == nullptr ? "missing" : std::string("got ") + value->type_name()));
  }
  return value->get<std::string>();
}

// A message's content: a string, or a list of input_text / output_text parts (text only: this model reads text).
std::string content_text(const Json& item, const std::string& where) {
  const Json* content = find_field(item, "content");
  if (content == nullptr) throw invalid_request(where, where + ".content: missing");
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) {
    throw invalid_request(where, fmt::format("{}.content: expected a string or a list of content parts, got {}", where,
                                             content->type_name()));
  }
  std::string text;
  for (std::size_t i = 0; i < content->size(); ++i) {
    const std::string part_at = at(where + ".content", i);
    const Json& part = (*content)[i];
    if (!part.is_object()) throw invalid_request(where, part_at + ": expected an object");
    const std::string type = required_text(part, "type", part_at);
    if (type != "input_text" && type != "output_text" && type != "text" && type != "reasoning_text") {
      throw invalid_request(where, fmt::format("{}.type: '{}' is not supported (this model reads text: input_text, "
                                               "output_text)",
                                               part_at, type));
    }
    text += required_text(part, "text", part_at);
  }
  return text;
}

// Input items → chat messages. Consecutive assistant-side items (reasoning, assistant messages, function calls)
// make one assistant message, as one Harmony assistant turn.
Json messages_from_input(const Json& input) {
  Json messages = Json::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return messages;
  }
  if (!input.is_array() || input.empty()) {
    throw invalid_request("input", fmt::format("input: expected a string or a non-empty list of items, got {}",
                                               input.is_array() ? "an empty list" : input.type_name()));
  }
  Json assistant;
  std::set<std::string> call_ids;  // of the function_call items so far: an output must answer one of them
  const auto flush = [&] {
    if (!assistant.is_null()) messages.push_back(std::move(assistant));
    assistant = Json();
  };
  const auto open_assistant = [&]() -> Json& {
    if (assistant.is_null()) assistant = {{"role", "assistant"}};
    return assistant;
  };
  for (std::size_t i = 0; i < input.size(); ++i) {
    const std::string where = at("input", i);
    const Json& item = input[i];
    if (!item.is_object()) throw invalid_request("input", fmt::format("{}: expected an object, got {}", where, item.type_name()));
    const std::string type = optional_string(item, "type").value_or("message");
    if (type == "message") {
      const std::string role = required_text(item, "role", where);
      const std::string text = content_text(item, where);
      if (role == "assistant") {
        Json& message = open_assistant();
        message["content"] = message.contains("content") ? message["content"].get<std::string>() + text : text;
        continue;
      }
      if (role != "user" && role != "system" && role != "developer") {
        throw invalid_request("input", fmt::format("{}.role: '{}' is not one of user, assistant, system, developer",
                                                   where, role));
      }
      flush();
      messages.push_back({{"role", role}, {"content", text}});
    } else if (type == "reasoning") {
      std::string text;
      if (const Json* content = find_field(item, "content")) {
        if (!content->is_array()) throw invalid_request("input", where + ".content: expected a list of reasoning_text parts");
        text = content_text(item, where);
      }
      Json& message = open_assistant();
      message["reasoning_content"] =
          message.contains("reasoning_content") ? message["reasoning_content"].get<std::string>() + text : text;
    } else if (type == "function_call") {
      Json& message = open_assistant();
      if (!message.contains("tool_calls")) message["tool_calls"] = Json::array();
      const std::string call_id = required_text(item, "call_id", where);
      call_ids.insert(call_id);
      message["tool_calls"].push_back({{"id", call_id},
                                       {"type", "function"},
                                       {"function", {{"name", required_text(item, "name", where)},
                                                     {"arguments", required_text(item, "arguments", where)}}}});
    } else if (type == "function_call_output") {
      flush();
      const Json* output = find_field(item, "output");
      if (output == nullptr) throw invalid_request("input", where + ".output: missing");
      Json content = output->is_string() ? *output : Json(content_text(Json{{"content", *output}}, where + ".output"));
      const std::string call_id = required_text(item, "call_id", where);
      if (!call_ids.contains(call_id)) {
        throw invalid_request(where + ".call_id", fmt::format("{}.call_id: no earlier function_call item has the call_id "
                                                              "'{}'",
                                                              where, call_id));
      }
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", content}});
    } else {
      throw invalid_request("input", fmt::format("{}.type: '{}' is not supported (message, reasoning, function_call, "
                                                 "function_call_output)",
                                                 where, type));
    }
  }
  flush();
  return messages;
}

// Responses' flat function tools → chat tools.
Json chat_tools(const Json& tools) {
  if (!tools.is_array()) throw invalid_request("tools", fmt::format("tools: expected a list, got {}", tools.type_name()));
  Json converted = Json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const std::string where = at("tools", i);
    const Json& tool = tools[i];
    if (!tool.is_object()) throw invalid_request("tools", where + ": expected an object");
    const std::string type = required_text(tool, "type", where);
    if (type != "function") {
      throw invalid_request("tools", fmt::format("{}.type: '{}' is not supported (only function tools; built-in tools "
                                                 "run nowhere here)",
                                                 where, type));
    }
    Json function = {{"name", required_text(tool, "name", where)}};
    if (const Json* description = find_field(tool, "description")) function["description"] = *description;
    if (const Json* parameters = find_field(tool, "parameters")) function["parameters"] = *parameters;
    converted.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return converted;
}

Json chat_tool_choice(const Json& choice) {
  if (!choice.is_object()) return choice;  // "auto", "none", "required" (the chat path checks the string)
  const std::string type = optional_string(choice, "type").value_or("");
  if (type != "function") {
    throw invalid_request("tool_choice", fmt::format("tool_choice.type: '{}' is not supported (only function)", type));
  }
  return Json{{"type", "function"}, {"function", {{"name", required_text(choice, "name", "tool_choice")}}}};
}

Json chat_response_format(const Json& text) {
  if (!text.is_object()) throw invalid_request("text", "text: expected an object with a format");
  const Json* format = find_field(text, "format");
  if (format == nullptr) return Json();
  if (!format->is_object()) throw invalid_request("text.format", "text.format: expected an object with a type");
  const std::string type = optional_string(*format, "type").value_or("");
  if (type != "json_schema") return Json{{"type", type}};
  Json json_schema = Json::object();
  for (const char* key : {"name", "schema", "strict", "description"}) {
    if (const Json* value = find_field(*format, key)) json_schema[key] = *value;
  }
  return Json{{"type", "json_schema"}, {"json_schema", std::move(json_schema)}};
}

ApiError renamed(const ApiError& error) {
  if (!error.param()) return error;
  for (const auto& [chat, responses] : kRenamedFields) {
    const std::string& param = *error.param();
    if (param != chat && !param.starts_with(std::string(chat) + ".") && !param.starts_with(std::string(chat) + "[")) continue;
    std::string message = error.what();
    if (message.starts_with(chat)) message = responses + message.substr(std::string(chat).size());
    return ApiError(error.status(), error.type(), message, responses + param.substr(std::string(chat).size()),
                    error.code());
  }
  return error;
}

Json usage_object(const Usage& usage, int64_t reasoning_tokens) {
  return Json{{"input_tokens", usage.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
              {"output_tokens", usage.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

// The model's deltas → output items, and the streaming events that build them. Non-streaming responses run the
// same builder and keep only the items, so both forms of one output agree.
class OutputItemBuilder {
 public:
  OutputItemBuilder(const ServingContext& context, const std::vector<TokenId>& prefill) : choice_(context, prefill) {}

  // Reads the tokens one at a time (a token whose text went to reasoning is counted as a reasoning token).
  void push(const std::vector<TokenId>& ids) {
    for (TokenId id : ids) {
      for (const harmony::ChatDelta& delta : choice_.push({id})) {
        if (delta.reasoning_content) ++reasoning_tokens_;
        on_delta(delta);
      }
    }
  }
  void finish(FinishReason reason) {
    for (const harmony::ChatDelta& delta : choice_.finish()) on_delta(delta);
    close();
    finish_reason_ = choice_.finish_reason(reason);
  }

  // Events written since the last call: (type, fields without type and sequence_number).
  std::vector<std::pair<std::string, Json>> take_events() { return std::exchange(events_, {}); }
  const Json& items() const { return items_; }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  const std::string& finish_reason() const { return finish_reason_; }

 private:
  enum class Kind { None, Reasoning, Message, FunctionCall };

  void on_delta(const harmony::ChatDelta& delta) {
    if (delta.reasoning_content) append_text(Kind::Reasoning, *delta.reasoning_content);
    if (delta.content) append_text(Kind::Message, *delta.content);
    if (delta.tool_call) {
      if (delta.tool_call->id) open_call(*delta.tool_call->id, delta.tool_call->name.value_or(""));
      if (!delta.tool_call->arguments.empty()) {
        open_.text += delta.tool_call->arguments;
        emit("response.function_call_arguments.delta",
             {{"item_id", open_.item["id"]}, {"output_index", open_.index}, {"delta", delta.tool_call->arguments}});
      }
    }
  }

  void append_text(Kind kind, const std::string& text) {
    if (open_.kind != kind) open_text_item(kind);
    open_.text += text;
    emit(kind == Kind::Reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
         {{"item_id", open_.item["id"]}, {"output_index", open_.index}, {"content_index", 0}, {"delta", text}});
  }

  void open_text_item(Kind kind) {
    close();
    open_.kind = kind;
    open_.index = items_.size();
    if (kind == Kind::Reasoning) {
      open_.item = {{"id", new_item_id("rs")}, {"type", "reasoning"}, {"summary", Json::array()}, {"content", Json::array()},
                    {"status", "in_progress"}};
    } else {
      open_.item = {{"id", new_item_id("msg")}, {"type", "message"},  {"role", "assistant"},
                    {"status", "in_progress"}, {"content", Json::array()}};
    }
    emit("response.output_item.added", {{"output_index", open_.index}, {"item", open_.item}});
    emit("response.content_part.added", {{"item_id", open_.item["id"]}, {"output_index", open_.index},
                                         {"content_index", 0}, {"part", part(kind, "")}});
  }

  void open_call(const std::string& call_id, const std::string& name) {
    close();
    open_.kind = Kind::FunctionCall;
    open_.index = items_.size();
    open_.item = {{"id", new_item_id("fc")}, {"type", "function_call"}, {"call_id", call_id}, {"name", name},
                  {"arguments", ""},     {"status", "in_progress"}};
    emit("response.output_item.added", {{"output_index", open_.index}, {"item", open_.item}});
  }

  static Json part(Kind kind, const std::string& text) {
    if (kind == Kind::Reasoning) return Json{{"type", "reasoning_text"}, {"text", text}};
    return Json{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
  }

  void close() {
    if (open_.kind == Kind::None) return;
    Json& item = open_.item;
    item["status"] = "completed";
    const Json id = item["id"];
    if (open_.kind == Kind::FunctionCall) {
      item["arguments"] = open_.text;
      emit("response.function_call_arguments.done",
           {{"item_id", id}, {"output_index", open_.index}, {"name", item["name"]}, {"arguments", open_.text}});
    } else {
      const bool reasoning = open_.kind == Kind::Reasoning;
      emit(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
           {{"item_id", id}, {"output_index", open_.index}, {"content_index", 0}, {"text", open_.text}});
      const Json done_part = part(open_.kind, open_.text);
      emit("response.content_part.done",
           {{"item_id", id}, {"output_index", open_.index}, {"content_index", 0}, {"part", done_part}});
      item["content"] = Json::array({done_part});
    }
    emit("response.output_item.done", {{"output_index", open_.index}, {"item", item}});
    items_.push_back(std::move(item));
    open_ = {};
  }

  void emit(const std::string& type, Json fields) { events_.emplace_back(type, std::move(fields)); }

  struct OpenItem {
    Kind kind = Kind::None;
    Json item;
    std::string text;
    std::size_t index = 0;
  };

  ChatChoice choice_;
  OpenItem open_;
  Json items_ = Json::array();
  std::vector<std::pair<std::string, Json>> events_;
  int64_t reasoning_tokens_ = 0;
  std::string finish_reason_;
};

// The response object: the request's echoed fields, then status, output and usage (and the served weights' version,
// as every generation answer carries it: docs/rl.md).
Json response_json(const std::string& id, const ServingContext& context, const ResponsesPlan& plan, int64_t created,
                   const std::string& status, Json output, Json usage, Json incomplete_details, Json error) {
  Json response = {{"id", id},
                   {"object", "response"},
                   {"created_at", created},
                   {"status", status},
                   {"error", std::move(error)},
                   {"incomplete_details", std::move(incomplete_details)},
                   {"model", context.model_name},
                   {"output", std::move(output)},
                   {"usage", std::move(usage)},
                   {kWeightVersionField, context.engine.weight_version()}};
  for (const auto& [key, value] : plan.echo.items()) response[key] = value;
  return response;
}

// Engine finish → (status, incomplete_details, error) of the response object.
std::tuple<std::string, Json, Json> outcome(const std::string& finish_reason) {
  if (finish_reason == "length") return {"incomplete", Json{{"reason", "max_output_tokens"}}, Json()};
  if (finish_reason == "abort") return {"cancelled", Json(), Json()};
  if (finish_reason == "error") return {"failed", Json(), Json{{"code", "server_error"}, {"message", "generation failed"}}};
  return {"completed", Json(), Json()};
}

class ResponseStream : public SseResponder {
 public:
  ResponseStream(std::string id, const ServingContext& context, ResponsesPlan plan)
      : id_(std::move(id)), context_(context), plan_(std::move(plan)), created_(unix_seconds_now()),
        builder_(context, plan_.chat.prefill) {}

  std::string begin() override {
    const Json response = response_json(id_, context_, plan_, created_, "in_progress", Json::array(), Json(), Json(), Json());
    std::string text = event("response.created", {{"response", response}});  // numbered before the next
    return text + event("response.in_progress", {{"response", response}});
  }

  std::string on_output(const RequestOutput& delta) override {
    std::string text;
    for (const SampleOutput& sample : delta.samples) {
      builder_.push(sample.token_ids);
      if (sample.finish_reason) builder_.finish(*sample.finish_reason);
    }
    for (auto& [type, fields] : builder_.take_events()) text += event(type, std::move(fields));
    if (delta.error) {
      const Json error = {{"code", "server_error"}, {"message", "generation failed: " + *delta.error}};
      return text + event("response.failed", {{"response", response_json(id_, context_, plan_, created_, "failed",
                                                                         builder_.items(), Json(), Json(), error)}});
    }
    if (!delta.finished) return text;
    const auto [status, incomplete, error] = outcome(builder_.finish_reason());
    const Json response = response_json(id_, context_, plan_, created_, status, builder_.items(),
                                        usage_object(delta.usage, builder_.reasoning_tokens()), incomplete, error);
    const char* type = status == "completed" ? "response.completed"
                       : status == "incomplete" ? "response.incomplete"
                                                : "response.failed";
    return text + event(type, {{"response", response}});
  }

 private:
  std::string event(const std::string& type, Json fields) {
    Json data = {{"type", type}, {"sequence_number", sequence_++}};
    for (auto& [key, value] : fields.items()) data[key] = std::move(value);
    return "event: " + type + "\n" + sse_event(data);
  }

  std::string id_;
  const ServingContext& context_;
  const ResponsesPlan plan_;
  int64_t created_;
  OutputItemBuilder builder_;
  int64_t sequence_ = 0;
};

}  // namespace

std::string new_item_id(const std::string& prefix) {
  std::string id = new_response_id(prefix);
  id[prefix.size()] = '_';
  return id;
}

Json chat_body_from_responses_request(const Json& body) {
  for (const char* field : {"previous_response_id", "conversation", "prompt"}) {
    if (find_field(body, field)) {
      throw invalid_request(field, fmt::format("{} is not supported by this server: it stores no responses or "
                                               "prompts; send the whole conversation as input",
                                               field));
    }
  }
  if (optional_bool(body, "background").value_or(false)) {
    throw invalid_request("background", "background is not supported by this server: responses are answered in the "
                                        "request that asks for them");
  }
  Json chat = Json::object();
  for (const char* field : kSharedFields) {
    if (const Json* value = find_field(body, field)) chat[field] = *value;
  }
  const Json* input = find_field(body, "input");
  if (input == nullptr) throw invalid_request("input", "input: missing (a string or a list of items is required)");
  Json messages = messages_from_input(*input);
  if (const Json* instructions = find_field(body, "instructions")) {
    if (!instructions->is_string()) {
      throw invalid_request("instructions", fmt::format("instructions: expected a string, got {}", instructions->type_name()));
    }
    messages.insert(messages.begin(), Json{{"role", "system"}, {"content", *instructions}});
  }
  chat["messages"] = std::move(messages);
  if (const Json* max_output = find_field(body, "max_output_tokens")) chat["max_tokens"] = *max_output;
  if (const Json* tools = find_field(body, "tools")) {
    Json converted = chat_tools(*tools);
    if (!converted.empty()) chat["tools"] = std::move(converted);
  }
  if (const Json* choice = find_field(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*choice);
  if (const Json* reasoning = find_field(body, "reasoning")) {
    if (!reasoning->is_object()) throw invalid_request("reasoning", "reasoning: expected an object such as {\"effort\": \"low\"}");
    if (const Json* effort = find_field(*reasoning, "effort")) chat["reasoning_effort"] = *effort;
  }
  if (const Json* text = find_field(body, "text")) {
    Json format = chat_response_format(*text);
    if (!format.is_null()) chat["response_format"] = std::move(format);
  }
  return chat;
}

ResponsesPlan plan_response(const Json& body, const ServingContext& context) {
  ResponsesPlan plan;
  try {
    plan.chat = plan_chat_completion(chat_body_from_responses_request(body), context);
  } catch (...) {
    throw renamed(to_api_error(std::current_exception()));
  }
  const SamplingParams& sampling = plan.chat.request.sampling;
  const auto echoed = [&](const char* key, Json fallback) {
    const Json* value = find_field(body, key);
    return value != nullptr ? *value : fallback;
  };
  Json effort;
  if (const Json* reasoning = find_field(body, "reasoning")) {
    if (const Json* value = find_field(*reasoning, "effort")) effort = *value;
  }
  plan.echo = {{"instructions", echoed("instructions", Json())},
               {"max_output_tokens", echoed("max_output_tokens", Json())},
               {"temperature", echoed("temperature", sampling.temperature)},
               {"top_p", echoed("top_p", sampling.top_p)},
               {"tools", echoed("tools", Json::array())},
               {"tool_choice", echoed("tool_choice", "auto")},
               {"parallel_tool_calls", echoed("parallel_tool_calls", true)},
               {"reasoning", {{"effort", effort}, {"summary", nullptr}}},
               {"text", echoed("text", Json{{"format", {{"type", "text"}}}})},
               {"metadata", echoed("metadata", Json::object())},
               {"previous_response_id", nullptr},
               {"store", false},
               {"background", false},
               {"truncation", "disabled"},
               {"user", echoed("user", Json())}};
  return plan;
}

Json response_object(const std::string& id, const ServingContext& context, const ResponsesPlan& plan,
                     const RequestOutput& output) {
  OutputItemBuilder builder(context, plan.chat.prefill);
  const SampleOutput& sample = output.samples.at(0);
  builder.push(sample.token_ids);
  builder.finish(sample.finish_reason.value_or(FinishReason::Abort));
  const auto [status, incomplete, error] = outcome(builder.finish_reason());
  return response_json(id, context, plan, unix_seconds_now(), status, builder.items(),
                       usage_object(output.usage, builder.reasoning_tokens()), incomplete, error);
}

std::unique_ptr<SseResponder> response_stream(const std::string& id, const ServingContext& context, ResponsesPlan plan) {
  return std::make_unique<ResponseStream>(id, context, std::move(plan));
}

}  // namespace beamline::server
