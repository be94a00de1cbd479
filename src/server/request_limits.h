#pragma once
// Limits on what one request may ask for, beyond --max-request-body-bytes (413): each keeps a single request from
// costing the server out of proportion to its size (deep JSON recursion, thousands of stop strings scanned at every
// token, a logit_bias table as large as the vocabulary). Past one, the request gets a 400 naming the field and the
// limit. `n` (1..128), logprobs (--max-logprobs) and max_tokens (the context) are checked where they are read.
#include <cstddef>

namespace beamline::server {

inline constexpr std::size_t kMaxJsonDepth = 64;           // nesting of objects and arrays in a body
inline constexpr std::size_t kMaxStopStrings = 64;         // `stop`
inline constexpr std::size_t kMaxStopStringBytes = 1024;   // each of `stop`
inline constexpr std::size_t kMaxStopTokenIds = 1024;      // `stop_token_ids`
inline constexpr std::size_t kMaxLogitBiasEntries = 1024;  // `logit_bias`
inline constexpr std::size_t kMaxTools = 128;              // `tools` (OpenAI's limit)

}  // namespace beamline::server
