#pragma once
// --api-key: every /v1/* request must carry `Authorization: Bearer <key>`.
#include <string_view>

namespace beamline::server {

// True when `authorization_header` is "Bearer <api_key>". The comparison takes the same time wherever the
// first differing byte is, so response timing does not reveal how much of a guess was right.
bool bearer_token_matches(std::string_view authorization_header, std::string_view api_key);

// Paths that need the key when one is set (the OpenAI API); /health and /metrics stay open for probes.
bool path_needs_api_key(std::string_view path);

}  // namespace beamline::server
