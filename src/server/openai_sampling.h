#pragma once
// The request fields both OpenAI endpoints share: model, stream options, and the sampling fields
// (OpenAI's and vLLM's extensions), read into the engine's SamplingParams.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/generation_config.h"
#include "engine/sampling_params.h"
#include "server/api_error.h"
#include "server/serving_context.h"

namespace beamline::server {

enum class Endpoint { ChatCompletions, Completions };

struct StreamOptions {
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk carrying usage
};

// `model` must be absent (the served model is meant), the served name, or one of `lora_names` (a loaded LoRA adapter,
// docs/lora.md): 404 model_not_found otherwise. Returns the adapter's name, "" for the base model.
std::string check_model(const Json& body, const std::string& served_model_name,
                        const std::vector<std::string>& lora_names = {});

// The `model` a response reports: the LoRA adapter the request named (as vLLM reports it), else the served model.
inline const std::string& response_model(const ServingContext& context, const GenerationRequest& request) {
  return request.lora_name.empty() ? context.model_name : request.lora_name;
}

StreamOptions read_stream_options(const Json& body);

// 400 for fields that change what the answer must be but that this server cannot honour
// (vLLM's old guided_* fields, prompt_logprobs, the legacy `functions`, completions' `suffix`, ...).
void reject_unsupported_fields(const Json& body, Endpoint endpoint);

// Sampling fields with their types checked (ranges are the engine's validate_sampling_params):
// n, temperature, top_p, top_k, min_p, presence/frequency/repetition_penalty, logit_bias, seed, stop,
// stop_token_ids, max_tokens (max_completion_tokens wins in chat), min_tokens, ignore_eos,
// skip_special_tokens, include_stop_str_in_output, and logprobs: chat's `logprobs: true` + `top_logprobs`,
// completions' integer `logprobs`, both limited to `max_logprobs`. Fields the request leaves out take the
// checkpoint's generation_config.json values (temperature, top_p, top_k, min_p, repetition_penalty, and
// as vLLM does.
SamplingParams read_sampling_params(const Json& body, Endpoint endpoint, int32_t max_logprobs,
                                    const GenerationConfig& defaults);

// A request without max_tokens gets generation_config.json's max_new_tokens, cut to the context left after
// the prompt (a default must not make a valid request fail).
void apply_default_max_tokens(SamplingParams& params, std::size_t prompt_tokens, int64_t max_model_len,
                              const GenerationConfig& defaults);

}  // namespace beamline::server
