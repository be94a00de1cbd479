#pragma once
// vLLM's POST /tokenize and POST /detokenize, and GET /version. /tokenize takes a `prompt` (text, encoded as
// /v1/completions encodes it) or chat `messages` (rendered as /v1/chat/completions renders them, so `count`
// equals that endpoint's usage.prompt_tokens for the same messages).
#include <string>

#include "server/api_error.h"
#include "server/serving_context.h"

namespace beamline::server {

// {"count", "max_model_len", "tokens"[, "token_strs"]}; 400 naming the field for a bad request (both or neither
// of `prompt` and `messages`, a wrong type), 404 for another model.
Json tokenize_response(const Json& body, const ServingContext& context);

// {"prompt": text of `tokens`}; 400 naming `tokens` for an id outside the vocabulary.
Json detokenize_response(const Json& body, const ServingContext& context);

// The project version CMake was given (project(... VERSION ...)): GET /version and `beamline --version`.
std::string beamline_version();

}  // namespace beamline::server
