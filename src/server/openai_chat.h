#pragma once
// POST /v1/chat/completions: request → Harmony prompt → engine request; engine output → Harmony streaming
// parse → message (content, reasoning_content, tool_calls) or SSE chunks.
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "harmony/harmony_parser.h"
#include "server/openai_mapping.h"
#include "server/openai_sampling.h"
#include "server/serving_context.h"
#include "server/sse.h"

namespace beamline::server {

struct ChatPlan {
  GenerationRequest request;     // the rendered prompt (ending in `prefill`) and the sampling options
  std::vector<TokenId> prefill;  // assistant header tokens forced by tool_choice; the parser reads them first
  StreamOptions stream;
};

// Validates the whole request (400 naming the field, 404 for another model) and renders the prompt.
// tool_choice: "auto" (default with tools), "none" (tools left out of the prompt), "required" (the answer
// starts as a call into the tool namespace), or {"type": "function", "function": {"name": N}} (the answer
// starts as a call to N, which must be one of `tools`).
ChatPlan plan_chat_completion(const Json& body, const ServingContext& context);

// One choice's tokens through the Harmony parser.
class ChatChoice {
 public:
  ChatChoice(const ServingContext& context, const std::vector<TokenId>& prefill);
  std::vector<harmony::ChatDelta> push(const std::vector<TokenId>& ids);
  std::vector<harmony::ChatDelta> finish();  // the output ended
  // "stop", "tool_calls" (the turn ended in <|call|>), "length", "abort" or "error".
  std::string finish_reason(FinishReason engine_reason) const;
  harmony::ChatMessage message() const;      // after finish()

 private:
  std::vector<harmony::ChatDelta> map(const std::vector<harmony::ParseEvent>& events);

  const ServingContext& context_;
  harmony::StreamingParser parser_;
  harmony::ChatStreamMapper mapper_;
  std::vector<harmony::ChatDelta> prefill_deltas_;  // e.g. a forced tool call's id and name: sent with the first push
};

Json usage_json(const Usage& usage);

// The whole (non-streaming) response of a finished request.
Json chat_completion_response(const std::string& id, const ServingContext& context, const ChatPlan& plan,
                              const RequestOutput& output);

std::unique_ptr<SseResponder> chat_completion_stream(const std::string& id, const ServingContext& context,
                                                     ChatPlan plan);

}  // namespace beamline::server
