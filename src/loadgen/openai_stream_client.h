#pragma once
// One streamed request to an OpenAI-compatible endpoint (/v1/completions or /v1/chat/completions), timed as
// `vllm bench serve` times it: TTFT at the first chunk carrying text (content or reasoning), an inter-token
// latency per later such chunk, the token counts from the usage chunk (stream_options.include_usage).
#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "loadgen/request_result.h"

namespace beamline::loadgen {

enum class ApiKind { Completions, ChatCompletions };

struct ServerEndpoint {
  std::string base_url;  // scheme://host:port
  std::string path;      // e.g. /v1/completions
  ApiKind kind = ApiKind::Completions;
  std::optional<std::string> api_key;
};

// Splits a URL such as http://127.0.0.1:8000/v1 into base_url and a path prefix.
struct SplitUrl {
  std::string base_url;
  std::string path;
};
SplitUrl split_url(const std::string& url);

// The payload vLLM's benchmark clients send: temperature 0 unless `sampling` says otherwise, max_tokens
// (max_completion_tokens for chat), stream with include_usage, ignore_eos when asked; `sampling`'s members
// (e.g. top_p) are added as they are.
nlohmann::json request_payload(ApiKind kind, const std::string& model, const BenchRequest& request, bool ignore_eos,
                               const nlohmann::json& sampling);

// Sends the payload and reads the stream to its end. Never throws for what the server or the network does: a
// failure is a result with success false and the reason in `error` (the HTTP status and body, or the error
// chunk's message). `dataset_prompt_len` is reported when the server sends no usage.
RequestResult send_streaming(const ServerEndpoint& endpoint, const nlohmann::json& payload, int64_t dataset_prompt_len,
                             std::chrono::steady_clock::time_point benchmark_start);

// GET {base_url}/v1/models: the first model's id (what --model defaults to).
std::string first_served_model(const std::string& base_url, const std::optional<std::string>& api_key);

}  // namespace beamline::loadgen
