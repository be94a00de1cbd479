#pragma once
// vLLM's --logprobs-mode: which values a request's `logprobs` report. "raw" is the model's soft-capped logits as they
// come out of the LM head; "processed" is the row the token was drawn from, after logit bias, masked tokens,
// penalties and (for sampled rows) temperature, min_p, top_k and top_p; "logprobs" is the log-softmax of those values,
// "logits" the values themselves. Tokens and ranks are ordered by the reported values.
#include <string>
#include <string_view>

namespace beamline {

enum class LogprobsMode { RawLogprobs, ProcessedLogprobs, RawLogits, ProcessedLogits };

// "raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"; throws Error naming --logprobs-mode.
LogprobsMode parse_logprobs_mode(std::string_view text);
std::string_view to_string(LogprobsMode mode);

}  // namespace beamline
