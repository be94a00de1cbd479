#pragma once
// What one benchmark request sends and what its client saw: the timings `vllm bench serve` reports.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace beamline::loadgen {

struct BenchRequest {
  nlohmann::json prompt;   // completions: a list of token ids or a string; chat: the user message's text
  int64_t prompt_len = 0;  // what the dataset meant to send (the server's usage is what is reported)
  int64_t output_len = 0;  // max_tokens
};

struct RequestResult {
  bool success = false;
  std::string error;
  double ttft = 0;           // seconds from sending to the first chunk with text
  std::vector<double> itl;   // seconds between successive chunks with text
  double latency = 0;        // seconds from sending to the end of the stream
  double start_time = 0;     // seconds since the benchmark started, when the request was sent
  int64_t prompt_len = 0;    // usage.prompt_tokens (the dataset's length when the server sends no usage)
  int64_t output_tokens = 0; // usage.completion_tokens (chunks with text when the server sends no usage)
  std::string generated_text;  // all text the stream carried (chat: reasoning and content)
  std::string content_text;    // chat: the content alone (what a client keeps in its history)
};

}  // namespace beamline::loadgen
