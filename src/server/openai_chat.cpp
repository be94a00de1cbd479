#include "server/openai_chat.h"

#include <fmt/format.h>

#include <algorithm>

#include "harmony/harmony_render.h"
#include "server/lora_endpoints.h"
#include "server/openai_logprobs.h"
#include "server/request_fields.h"
#include "server/request_limits.h"
#include "server/routed_experts_json.h"
#include "server/structured_outputs.h"

namespace beamline::server {

namespace {

std::vector<std::string> tool_names(const Json& body) {
  std::vector<std::string> names;
  const Json* tools = find_field(body, "tools");
  if (tools == nullptr || !tools->is_array()) return names;
  for (const Json& tool : *tools) {
    const Json* function = find_field(tool, "function");
    if (function != nullptr && function->is_object()) {
      if (auto name = optional_string(*function, "name")) names.push_back(*name);
    }
  }
  return names;
}

ToolChoice read_tool_choice(const Json& body) {
  ToolChoice choice;
  const Json* value = find_field(body, "tool_choice");
  const std::vector<std::string> names = tool_names(body);
  if (value == nullptr) return choice;
  if (value->is_string()) {
    const std::string mode = value->get<std::string>();
    if (mode == "auto") {
      choice.mode = ToolChoiceMode::Auto;
    } else if (mode == "none") {
      choice.mode = ToolChoiceMode::None;
    } else if (mode == "required") {
      choice.mode = ToolChoiceMode::Required;
    } else {
      throw invalid_request("tool_choice", fmt::format("tool_choice: '{}' is not one of 'none', 'auto', 'required' "
                                                       "or a {{\"type\": \"function\", ...}} object",
                                                       mode));
    }
  } else if (value->is_object()) {
    const std::string type = optional_string(*value, "type").value_or("");
    if (type != "function") {
      throw invalid_request("tool_choice", "tool_choice.type: expected \"function\"");
    }
    const Json* function = find_field(*value, "function");
    if (function == nullptr || !function->is_object()) {
      throw invalid_request("tool_choice", "tool_choice.function: expected an object with a name");
    }
    auto name = optional_string(*function, "name");
    if (!name) throw invalid_request("tool_choice", "tool_choice.function.name: missing (a string is required)");
    choice.mode = ToolChoiceMode::Named;
    choice.name = *name;
  } else {
    throw invalid_request("tool_choice",
                          fmt::format("tool_choice: expected a string or an object, got {}", value->type_name()));
  }
  if ((choice.mode == ToolChoiceMode::Required || choice.mode == ToolChoiceMode::Named) && names.empty()) {
    throw invalid_request("tool_choice", "tool_choice asks for a tool call, but the request defines no tools");
  }
  if (choice.mode == ToolChoiceMode::Named && std::find(names.begin(), names.end(), choice.name) == names.end()) {
    throw invalid_request("tool_choice", fmt::format("tool_choice names the function '{}', which is not among the "
                                                     "request's tools",
                                                     choice.name));
  }
  return choice;
}

// The assistant header a forced tool call starts with (the channel-first form the parser accepts).
harmony::Pieces tool_call_prefill(const ToolChoice& choice, const harmony::HarmonyTemplate& harmony_template) {
  harmony::Pieces pieces;
  pieces.push_back({true, "<|channel|>"});
  const std::string recipient = harmony_template.tool_namespace + ".";
  if (choice.mode == ToolChoiceMode::Required) {
    pieces.push_back({false, harmony_template.tool_channel + " to=" + recipient});
    return pieces;
  }
  pieces.push_back({false, harmony_template.tool_channel + " to=" + recipient + choice.name + " "});
  pieces.push_back({true, "<|constrain|>"});
  pieces.push_back({false, "json"});
  pieces.push_back({true, "<|message|>"});
  return pieces;
}

Json chunk_json(const std::string& id, const ServingContext& context, const std::string& model, int64_t created,
                Json choices, bool include_usage) {
  Json chunk = {{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model},
                {"choices", std::move(choices)}};
  if (include_usage) chunk["usage"] = nullptr;
  chunk[kWeightVersionField] = context.engine.weight_version();
  return chunk;
}

class ChatStream : public SseResponder {
 public:
  ChatStream(std::string id, const ServingContext& context, ChatPlan plan)
      : id_(std::move(id)), context_(context), plan_(std::move(plan)), created_(unix_seconds_now()) {
    for (int32_t i = 0; i < plan_.request.sampling.n; ++i) {
      choices_.push_back(std::make_unique<ChoiceState>(context, plan_.prefill));
    }
  }

  std::string begin() override {
    std::string events;
    for (std::size_t i = 0; i < choices_.size(); ++i) {
      events += chunk(i, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    }
    return events;
  }

  std::string on_output(const RequestOutput& delta) override {
    std::string events;
    for (const SampleOutput& sample : delta.samples) {
      ChoiceState& state = *choices_.at(static_cast<std::size_t>(sample.index));
      const auto index = static_cast<std::size_t>(sample.index);
      state.pending_logprobs.insert(state.pending_logprobs.end(), sample.logprobs.begin(), sample.logprobs.end());
      state.pending_routed_experts.insert(state.pending_routed_experts.end(), sample.routed_experts.begin(),
                                          sample.routed_experts.end());
      std::vector<harmony::ChatDelta> deltas = state.choice.push(sample.token_ids);
      if (sample.finish_reason) {
        std::vector<harmony::ChatDelta> last = state.choice.finish();
        deltas.insert(deltas.end(), last.begin(), last.end());
      }
      for (const harmony::ChatDelta& chat_delta : deltas) {
        events += chunk(index, harmony::to_json(chat_delta), take_logprobs(state), nullptr, &state);
      }
      if (sample.finish_reason) {
        events += chunk(index, Json::object(), take_logprobs(state), state.choice.finish_reason(*sample.finish_reason),
                        &state);
      }
    }
    if (delta.error) return events + sse_error(internal_error("generation failed: " + *delta.error));
    if (!delta.finished) return events;
    if (plan_.stream.include_usage) {
      Json usage_chunk = chunk_json(id_, context_, response_model(context_, plan_.request), created_, Json::array(), false);
      usage_chunk["usage"] = usage_json(delta.usage);
      events += sse_event(usage_chunk);
    }
    return events + kSseDone;
  }

 private:
  struct ChoiceState {
    ChoiceState(const ServingContext& context, const std::vector<TokenId>& prefill) : choice(context, prefill) {}
    ChatChoice choice;
    std::vector<TokenLogprob> pending_logprobs;
    std::vector<int16_t> pending_routed_experts;  // like the logprobs, sent with the next chunk
  };

  // Logprobs ride on the next chunk after their tokens (header tokens produce no delta of their own).
  Json take_logprobs(ChoiceState& state) {
    if (!plan_.request.sampling.logprobs || state.pending_logprobs.empty()) return nullptr;
    Json json = chat_logprobs_json(context_.tokenizer, state.pending_logprobs);
    state.pending_logprobs.clear();
    return json;
  }

  std::string chunk(std::size_t index, Json delta, Json logprobs, Json finish_reason,
                    ChoiceState* routed_from = nullptr) {
    Json choice = {{"index", index},
                   {"delta", std::move(delta)},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", std::move(finish_reason)}};
    if (plan_.request.return_routed_experts && routed_from != nullptr) {
      choice[kRoutedExpertsField] = routed_experts_base64(routed_from->pending_routed_experts);
      routed_from->pending_routed_experts.clear();
    }
    return sse_event(chunk_json(id_, context_, response_model(context_, plan_.request), created_,
                                Json::array({std::move(choice)}), plan_.stream.include_usage));
  }

  std::string id_;
  const ServingContext& context_;
  const ChatPlan plan_;
  int64_t created_;
  std::vector<std::unique_ptr<ChoiceState>> choices_;
};

}  // namespace

ChatPlan plan_chat_completion(const Json& body, const ServingContext& context) {
  const std::string lora_name = requested_model_lora(body, context);
  reject_unsupported_fields(body, Endpoint::ChatCompletions);
  ChatPlan plan;
  plan.stream = read_stream_options(body);
  plan.request.sampling =
      read_sampling_params(body, Endpoint::ChatCompletions, context.engine.config().max_logprobs,
                           context.generation_config);
  const Json* messages = find_field(body, "messages");
  if (messages == nullptr) throw invalid_request("messages", "messages: missing (a list of messages is required)");
  if (!messages->is_array() || messages->empty()) {
    throw invalid_request("messages", "messages: expected a non-empty list of messages");
  }
  if (const Json* tools = find_field(body, "tools"); tools != nullptr && tools->is_array() && tools->size() > kMaxTools) {
    throw invalid_request("tools", fmt::format("tools: {} tools, more than the limit of {}", tools->size(), kMaxTools));
  }
  const ToolChoice tool_choice = read_tool_choice(body);
  if (auto effort = optional_string(body, "reasoning_effort"); effort && !harmony::reasoning_effort_from_name(*effort)) {
    throw invalid_request("reasoning_effort",
                          fmt::format("reasoning_effort: '{}' is not one of 'low', 'medium', 'high'", *effort));
  }

  harmony::Conversation conversation;
  if (tool_choice.mode == ToolChoiceMode::None) {
    Json without_tools = body;
    without_tools.erase("tools");
    conversation = harmony::conversation_from_chat_request(without_tools, context.harmony_template, harmony::today_utc());
  } else {
    conversation = harmony::conversation_from_chat_request(body, context.harmony_template, harmony::today_utc());
  }
  harmony::Pieces pieces = harmony::render_for_completion(conversation, harmony::Role::Assistant,
                                                          context.harmony_template.render_options());
  plan.request.prompt = harmony::pieces_to_ids(pieces, context.tokenizer);
  if (tool_choice.mode == ToolChoiceMode::Required || tool_choice.mode == ToolChoiceMode::Named) {
    plan.prefill = harmony::pieces_to_ids(tool_call_prefill(tool_choice, context.harmony_template), context.tokenizer);
    plan.request.prompt.insert(plan.request.prompt.end(), plan.prefill.begin(), plan.prefill.end());
  }

  SamplingParams& sampling = plan.request.sampling;
  apply_default_max_tokens(sampling, plan.request.prompt.size(), context.engine.config().max_model_len,
                           context.generation_config);
  for (TokenId stop : context.harmony_stop_ids) {
    if (std::find(sampling.stop_token_ids.begin(), sampling.stop_token_ids.end(), stop) == sampling.stop_token_ids.end()) {
      sampling.stop_token_ids.push_back(stop);
    }
  }
  // The Harmony parser reads token ids; the engine's text is needed only to find stop strings.
  plan.request.detokenize = !sampling.stop.empty();
  plan.request.cache_salt = optional_string(body, "cache_salt").value_or("");
  plan.request.lora_name = lora_name;
  plan.request.grammar = chat_grammar(body, tool_choice, context);
  plan.request.return_routed_experts = optional_bool(body, "return_routed_experts").value_or(false);
  return plan;
}

ChatChoice::ChatChoice(const ServingContext& context, const std::vector<TokenId>& prefill)
    : context_(context),
      parser_(context.tokenizer, harmony::ParserOptions{harmony::Role::Assistant, /*strict=*/false,
                                                        context.harmony_template.channels}),
      mapper_(context.harmony_template) {
  for (TokenId id : prefill) {
    std::vector<harmony::ChatDelta> deltas = map(parser_.push(id));
    prefill_deltas_.insert(prefill_deltas_.end(), deltas.begin(), deltas.end());
  }
}

std::vector<harmony::ChatDelta> ChatChoice::map(const std::vector<harmony::ParseEvent>& events) {
  std::vector<harmony::ChatDelta> deltas;
  for (const harmony::ParseEvent& event : events) {
    if (auto delta = mapper_.on_event(event)) deltas.push_back(std::move(*delta));
  }
  return deltas;
}

std::vector<harmony::ChatDelta> ChatChoice::push(const std::vector<TokenId>& ids) {
  std::vector<harmony::ChatDelta> deltas = std::move(prefill_deltas_);
  prefill_deltas_.clear();
  for (TokenId id : ids) {
    std::vector<harmony::ChatDelta> more = map(parser_.push(id));
    deltas.insert(deltas.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return deltas;
}

std::vector<harmony::ChatDelta> ChatChoice::finish() {
  std::vector<harmony::ChatDelta> deltas = std::move(prefill_deltas_);
  prefill_deltas_.clear();
  std::vector<harmony::ChatDelta> last = map(parser_.finish());
  deltas.insert(deltas.end(), std::make_move_iterator(last.begin()), std::make_move_iterator(last.end()));
  return deltas;
}

std::string ChatChoice::finish_reason(FinishReason engine_reason) const {
  switch (engine_reason) {
    case FinishReason::Stop:
      return std::string(harmony::finish_reason_name(harmony::finish_reason(parser_.last_terminator(), false)));
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "error";
}

harmony::ChatMessage ChatChoice::message() const {
  return harmony::chat_message_from_harmony(parser_.messages(), context_.harmony_template);
}

Json usage_json(const Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

Json chat_completion_response(const std::string& id, const ServingContext& context, const ChatPlan& plan,
                              const RequestOutput& output) {
  Json choices = Json::array();
  for (const SampleOutput& sample : output.samples) {
    ChatChoice choice(context, plan.prefill);
    choice.push(sample.token_ids);
    choice.finish();
    Json logprobs = plan.request.sampling.logprobs ? chat_logprobs_json(context.tokenizer, sample.logprobs) : Json();
    Json json_choice = {{"index", sample.index},
                        {"message", harmony::to_json(choice.message())},
                        {"logprobs", std::move(logprobs)},
                        {"finish_reason", choice.finish_reason(sample.finish_reason.value_or(FinishReason::Abort))}};
    if (plan.request.return_routed_experts)
      json_choice[kRoutedExpertsField] = routed_experts_base64(sample.routed_experts);
    choices.push_back(std::move(json_choice));
  }
  return Json{{"id", id},
              {"object", "chat.completion"},
              {"created", unix_seconds_now()},
              {"model", response_model(context, plan.request)},
              {"choices", std::move(choices)},
              {"usage", usage_json(output.usage)},
              {kWeightVersionField, context.engine.weight_version()}};
}

std::unique_ptr<SseResponder> chat_completion_stream(const std::string& id, const ServingContext& context,
                                                     ChatPlan plan) {
  return std::make_unique<ChatStream>(id, context, std::move(plan));
}

}  // namespace beamline::server
