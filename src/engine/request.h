#pragma once
// A generation request as the engine takes it, and the error for a bad one.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace beamline {

class CompiledGrammar;  // structured/token_mask.h

struct GenerationRequest {
  std::string request_id;               // unique among in-flight requests
  std::vector<TokenId> prompt;          // at least one token
  SamplingParams sampling;
  std::string cache_salt;               // prefix-cache isolation key: only equal salts share cached blocks
  bool detokenize = true;               // produce text deltas (needs the engine's tokenizer)
  // Structured outputs: every sampled token must keep the output inside this grammar (each sample gets its own
  // matcher). The token that completes it must stop the output: one of the grammar's stop tokens (e.g. eos) or a
  // token the grammar ends with, in sampling.stop_token_ids (Harmony's <|call|>, <|return|>). Null: unconstrained.
  std::shared_ptr<const CompiledGrammar> grammar;
  // Routing replay (SGLang's return_routed_experts, needs --enable-return-routed-experts): each sample's events carry
  // the experts every computed token was routed to (SampleOutput::routed_experts). The prompt is then computed, not
  // read from the prefix cache.
  bool return_routed_experts = false;
  // LoRA (docs/lora.md): the adapter's name ("": the base model). Engine::add_request resolves it to the adapter's
  // slot and load id (-1 and 0 for none), which keep the request on that adapter even if the name is unloaded and
  // loaded again meanwhile.
  std::string lora_name;
  int32_t lora_slot = -1;
  uint64_t lora_id = 0;
};

// A request the engine refuses; `param` names the offending field (OpenAI's error.param).
class InvalidRequest : public Error {
 public:
  InvalidRequest(std::string param, const std::string& message) : Error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

struct RequestLimits {
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  int32_t max_logprobs = 0;
  bool has_tokenizer = false;
  bool routed_experts_enabled = false;  // --enable-return-routed-experts
};

// Throws InvalidRequest naming the field: empty prompt or ids outside the vocabulary ("prompt"), prompt plus
// max_tokens over max_model_len ("max_tokens", or "prompt" when the prompt alone is too long), text output or
// stop strings without a tokenizer, and every check of validate_sampling_params.
void validate_request(const GenerationRequest& request, const RequestLimits& limits);

// max_tokens, or what is left of the context after the prompt.
int32_t effective_max_tokens(const GenerationRequest& request, int64_t max_model_len);

}  // namespace beamline
