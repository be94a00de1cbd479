#pragma once
// The prompts a benchmark sends, as `vllm bench serve`'s datasets make them.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loadgen/openai_stream_client.h"
#include "loadgen/request_result.h"

namespace beamline::loadgen {

struct RandomDatasetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;      // --random-input-len
  int64_t output_len = 128;      // --random-output-len
  double range_ratio = 0.0;      // --random-range-ratio: lengths uniform in [len*(1-r), len*(1+r)]
  int64_t prefix_len = 0;        // --random-prefix-len: a prefix every prompt shares
  int64_t token_id_low = 0;      // token ids are drawn uniformly from [low, high]; the client has no tokenizer,
  int64_t token_id_high = 255;   // so the range must lie inside the served model's vocabulary
  uint64_t seed = 0;
};

// Completions get token-id prompts of exactly the drawn length. Chat messages must be text: there each token of
// the draw becomes a word of a small common-English list (about one token per word with BPE vocabularies; the
// reported input tokens are the server's count).
std::vector<BenchRequest> random_dataset(const RandomDatasetOptions& options, ApiKind kind);

// A multi-turn conversation: each turn resends the conversation so far (earlier turns and the server's answers)
// plus a new user message, so the earlier turns are a prefix the server's cache can serve.
struct BenchSession {
  std::vector<std::string> user_turns;
  int64_t output_len = 0;  // max_tokens of each turn
};

struct MultiTurnDatasetOptions {
  int64_t num_sessions = 16;
  int64_t num_turns = 4;
  int64_t input_len = 64;   // words of each user turn (--random-input-len)
  int64_t output_len = 32;  // --random-output-len
  double range_ratio = 0.0;
  uint64_t seed = 0;
};

// User turns of common English words, lengths drawn as random_dataset draws them.
std::vector<BenchSession> multi_turn_dataset(const MultiTurnDatasetOptions& options);

// A JSONL file of {"prompt": "..."} lines (vLLM's custom dataset), the first `num_prompts` (all when 0), each asking
// for `output_len` tokens. A bad line fails naming the file and line.
std::vector<BenchRequest> custom_dataset(const std::filesystem::path& path, int64_t num_prompts, int64_t output_len);

}  // namespace beamline::loadgen
