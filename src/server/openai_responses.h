#pragma once
// POST /v1/responses (OpenAI's Responses API, as vLLM serves it for Harmony models), on the chat path: the
// request becomes the equivalent Chat Completions body (input items → messages, instructions → a system message,
// flat function tools → chat tools, max_output_tokens → max_tokens, reasoning.effort → reasoning_effort,
// text.format → response_format), which plan_chat_completion validates, renders and samples; the Harmony output
// becomes output items in the order the model wrote them: analysis → a `reasoning` item, a call into the tool
// namespace → a `function_call` item, other assistant text → a `message` item with `output_text`.
// Nothing is stored: previous_response_id and background are refused, `store` is answered false.
#include <memory>
#include <string>

#include "server/openai_chat.h"
#include "server/serving_context.h"
#include "server/sse.h"

namespace beamline::server {

struct ResponsesPlan {
  ChatPlan chat;
  Json echo;  // the request fields a response object repeats (instructions, tools, temperature, ...)
};

// OpenAI's ids for responses and their items: a type prefix ("resp", "msg", "rs", "fc"), an underscore, random hex.
std::string new_item_id(const std::string& prefix);

// 400 naming the Responses field (input[2].call_id, tools[0].type, max_output_tokens, ...), 404 for another model.
ResponsesPlan plan_response(const Json& body, const ServingContext& context);

// The Chat Completions body a Responses request stands for (exposed for tests).
Json chat_body_from_responses_request(const Json& body);

Json response_object(const std::string& id, const ServingContext& context, const ResponsesPlan& plan,
                     const RequestOutput& output);

// Streaming: `event: response.created` ... `event: response.completed` (or response.incomplete), each event's
// data carrying its `type` and `sequence_number`.
std::unique_ptr<SseResponder> response_stream(const std::string& id, const ServingContext& context, ResponsesPlan plan);

}  // namespace beamline::server
