#pragma once
// POST /v1/completions: raw prompts (text, or token ids) continued by the engine; no chat template.
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/openai_sampling.h"
#include "server/serving_context.h"
#include "server/sse.h"

namespace beamline::server {

// One prompt of a request: its own engine request.
struct CompletionPlan {
  GenerationRequest request;
  StreamOptions stream;
  bool echo = false;              // the prompt's text goes before each choice's text
  bool return_token_ids = false;  // vLLM's: each choice carries prompt_token_ids and token_ids
  std::string prompt_text;        // for echo
};

// `prompt` is a string, a list of token ids, or a list of those (a batch: one plan per prompt, in order).
// Special-token strings in a text prompt are read as special tokens, so a Harmony-formatted prompt works.
// Streaming takes one prompt.
std::vector<CompletionPlan> plan_completions(const Json& body, const ServingContext& context);

// The response to a batch: the choices of prompt p are numbered p * n + sample index (vLLM's). `outputs` are the
// plans' whole outputs, in order.
Json completion_response(const std::string& id, const ServingContext& context, const std::vector<CompletionPlan>& plans,
                         const std::vector<RequestOutput>& outputs);

std::unique_ptr<SseResponder> completion_stream(const std::string& id, const ServingContext& context,
                                                CompletionPlan plan);

}  // namespace beamline::server
