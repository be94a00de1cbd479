#pragma once
// POST /v1/completions: a raw prompt (text, or token ids) continued by the engine; no chat template.
#include <memory>
#include <string>

#include "engine/request.h"
#include "server/openai_sampling.h"
#include "server/serving_context.h"
#include "server/sse.h"

namespace beamline::server {

struct CompletionPlan {
  GenerationRequest request;
  StreamOptions stream;
  bool echo = false;        // the prompt's text goes before each choice's text
  std::string prompt_text;  // for echo
};

// `prompt` is a string, a list of token ids, or a list holding one of those (one prompt per request).
// Special-token strings in a text prompt are read as special tokens, so a Harmony-formatted prompt works.
CompletionPlan plan_completion(const Json& body, const ServingContext& context);

Json completion_response(const std::string& id, const ServingContext& context, const CompletionPlan& plan,
                         const RequestOutput& output);

std::unique_ptr<SseResponder> completion_stream(const std::string& id, const ServingContext& context,
                                                CompletionPlan plan);

}  // namespace beamline::server
