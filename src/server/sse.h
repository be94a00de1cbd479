#pragma once
// Server-sent events as the OpenAI streaming API uses them: `data: <json>\n\n` per chunk, then
// `data: [DONE]\n\n`.
#include <string>

#include "engine/request_output.h"
#include "server/api_error.h"

namespace beamline::server {

// JSON text for the wire: invalid UTF-8 (a token that splits a character) becomes U+FFFD instead of throwing.
std::string dump_json(const Json& json);

std::string sse_event(const Json& json);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// Turns one request's engine events into SSE text. The HTTP layer writes begin(), then on_output() for
// every event the engine stream yields; the event with `finished` set gets the closing chunks and [DONE].
class SseResponder {
 public:
  virtual ~SseResponder() = default;
  virtual std::string begin() = 0;
  virtual std::string on_output(const RequestOutput& delta) = 0;
};

// What a stream sends when the engine failed mid-way: an error object in OpenAI's shape, then [DONE].
std::string sse_error(const ApiError& error);

}  // namespace beamline::server
