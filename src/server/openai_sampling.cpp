#include "server/openai_sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>

#include "server/request_fields.h"
#include "server/request_limits.h"

namespace beamline::server {

namespace {

// OpenAI's n limit; the engine checks the same bound.
constexpr int64_t kMaxChoices = 128;

std::vector<std::pair<TokenId, float>> read_logit_bias(const Json& body) {
  const Json* bias = find_field(body, "logit_bias");
  if (bias == nullptr) return {};
  if (!bias->is_object()) {
    throw invalid_request("logit_bias", fmt::format("logit_bias: expected an object mapping token ids to biases, got {}",
                                                    bias->type_name()));
  }
  if (bias->size() > kMaxLogitBiasEntries) {
    throw invalid_request("logit_bias", fmt::format("logit_bias: {} entries, more than the limit of {}", bias->size(),
                                                    kMaxLogitBiasEntries));
  }
  std::vector<std::pair<TokenId, float>> entries;
  for (const auto& [key, value] : bias->items()) {
    int64_t token = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), token);
    if (error != std::errc() || end != key.data() + key.size() || token < 0 ||
        token > std::numeric_limits<TokenId>::max()) {
      throw invalid_request("logit_bias", fmt::format("logit_bias: key '{}' is not a token id", key));
    }
    if (!value.is_number()) {
      throw invalid_request("logit_bias",
                            fmt::format("logit_bias[{}]: expected a number, got {}", key, value.type_name()));
    }
    const double amount = value.get<double>();
    if (amount < -100 || amount > 100) {
      throw invalid_request("logit_bias", fmt::format("logit_bias[{}]: {} is outside [-100, 100]", key, amount));
    }
    entries.emplace_back(static_cast<TokenId>(token), static_cast<float>(amount));
  }
  return entries;
}

std::optional<int32_t> read_max_tokens(const Json& body, Endpoint endpoint) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  const std::string key = chat && find_field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  auto value = optional_integer(body, key);
  if (!value) return std::nullopt;
  if (*value < 1) throw invalid_request(key, fmt::format("{} must be at least 1 (got {})", key, *value));
  // Larger than any context: the engine's check against the prompt and max_model_len names it precisely, but
  // the value must first fit the engine's field.
  if (*value > std::numeric_limits<int32_t>::max()) {
    throw invalid_request(key, fmt::format("{} is too large (got {})", key, *value));
  }
  return static_cast<int32_t>(*value);
}

std::optional<int32_t> read_logprobs(const Json& body, Endpoint endpoint, int32_t max_logprobs) {
  if (endpoint == Endpoint::Completions) return integer_in_range(body, "logprobs", 0, max_logprobs);
  const bool wanted = optional_bool(body, "logprobs").value_or(false);
  auto top = integer_in_range(body, "top_logprobs", 0, max_logprobs);
  if (top && *top > 0 && !wanted) {
    throw invalid_request("top_logprobs", "top_logprobs needs logprobs set to true");
  }
  if (!wanted) return std::nullopt;
  return top.value_or(0);
}

}  // namespace

std::string check_model(const Json& body, const std::string& served_model_name,
                        const std::vector<std::string>& lora_names) {
  auto model = optional_string(body, "model");
  if (!model || *model == served_model_name) return {};
  if (std::find(lora_names.begin(), lora_names.end(), *model) == lora_names.end()) throw model_not_found(*model);
  return *model;
}

StreamOptions read_stream_options(const Json& body) {
  StreamOptions options;
  options.stream = optional_bool(body, "stream").value_or(false);
  if (const Json* stream_options = find_field(body, "stream_options")) {
    if (!options.stream) {
      throw invalid_request("stream_options", "stream_options is only allowed when stream is true");
    }
    if (!stream_options->is_object()) {
      throw invalid_request("stream_options",
                            fmt::format("stream_options: expected an object, got {}", stream_options->type_name()));
    }
    if (const Json* include = find_field(*stream_options, "include_usage")) {
      if (!include->is_boolean()) {
        throw invalid_request("stream_options.include_usage",
                              fmt::format("stream_options.include_usage: expected true or false, got {}",
                                          include->type_name()));
      }
      options.include_usage = include->get<bool>();
    }
  }
  return options;
}

void reject_unsupported_fields(const Json& body, Endpoint endpoint) {
  auto unsupported = [](const std::string& field, const std::string& why) {
    return invalid_request(field, fmt::format("{} is not supported by this server: {}", field, why));
  };
  // vLLM's older names for structured_outputs (server/structured_outputs reads the current fields).
  for (const char* field : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (find_field(body, field)) throw unsupported(field, "use structured_outputs (json, regex, choice, grammar)");
  }
  if (endpoint == Endpoint::ChatCompletions && find_field(body, "prompt_logprobs"))
    throw unsupported("prompt_logprobs", "prompt logprobs are computed for /v1/completions only");
  if (auto best_of = optional_integer(body, "best_of")) {
    const int64_t n = optional_integer(body, "n").value_or(1);
    if (*best_of != n) throw unsupported("best_of", "best_of must equal n");
  }
  if (endpoint == Endpoint::ChatCompletions) {
    if (find_field(body, "functions") || find_field(body, "function_call")) {
      throw unsupported(find_field(body, "functions") ? "functions" : "function_call",
                        "use tools and tool_choice instead");
    }
    if (find_field(body, "audio")) throw unsupported("audio", "this model reads and writes text only");
    if (const Json* modalities = find_field(body, "modalities")) {
      const bool text_only = modalities->is_array() && modalities->size() == 1 && (*modalities)[0] == "text";
      if (!text_only) throw unsupported("modalities", "this model reads and writes text only");
    }
  } else if (auto suffix = optional_string(body, "suffix"); suffix && !suffix->empty()) {
    throw unsupported("suffix", "insertion is not implemented");
  }
}

SamplingParams read_sampling_params(const Json& body, Endpoint endpoint, int32_t max_logprobs,
                                    const GenerationConfig& defaults) {
  SamplingParams params;
  params.temperature = defaults.temperature.value_or(params.temperature);
  params.top_p = defaults.top_p.value_or(params.top_p);
  params.top_k = defaults.top_k.value_or(params.top_k);
  params.min_p = defaults.min_p.value_or(params.min_p);
  params.repetition_penalty = defaults.repetition_penalty.value_or(params.repetition_penalty);
  params.n = integer_in_range(body, "n", 1, kMaxChoices).value_or(1);
  if (auto value = optional_number(body, "temperature")) params.temperature = static_cast<float>(*value);
  if (auto value = optional_number(body, "top_p")) params.top_p = static_cast<float>(*value);
  if (auto value = optional_integer(body, "top_k")) {
    if (*value < -1 || *value > std::numeric_limits<int32_t>::max()) {
      throw invalid_request("top_k", fmt::format("top_k must be -1 or 0 (off) or a positive count (got {})", *value));
    }
    params.top_k = static_cast<int32_t>(*value);
  }
  if (auto value = optional_number(body, "min_p")) params.min_p = static_cast<float>(*value);
  if (auto value = optional_number(body, "presence_penalty")) params.presence_penalty = static_cast<float>(*value);
  if (auto value = optional_number(body, "frequency_penalty")) params.frequency_penalty = static_cast<float>(*value);
  if (auto value = optional_number(body, "repetition_penalty")) params.repetition_penalty = static_cast<float>(*value);
  params.logit_bias = read_logit_bias(body);
  if (auto value = optional_integer(body, "seed")) params.seed = static_cast<uint64_t>(*value);
  params.max_tokens = read_max_tokens(body, endpoint);
  params.min_tokens = integer_in_range(body, "min_tokens", 0, std::numeric_limits<int32_t>::max()).value_or(0);
  params.stop = string_or_strings(body, "stop");
  if (params.stop.size() > kMaxStopStrings) {
    throw invalid_request("stop", fmt::format("stop: {} strings, more than the limit of {}", params.stop.size(),
                                              kMaxStopStrings));
  }
  for (std::size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].size() > kMaxStopStringBytes) {
      throw invalid_request("stop", fmt::format("stop[{}]: {} bytes, longer than the limit of {}", i,
                                                params.stop[i].size(), kMaxStopStringBytes));
    }
  }
  const std::vector<int64_t> stop_token_ids = integer_list(body, "stop_token_ids");
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    throw invalid_request("stop_token_ids", fmt::format("stop_token_ids: {} ids, more than the limit of {}",
                                                        stop_token_ids.size(), kMaxStopTokenIds));
  }
  for (int64_t token : stop_token_ids) {
    if (token < 0 || token > std::numeric_limits<TokenId>::max()) {
      throw invalid_request("stop_token_ids", fmt::format("stop_token_ids: {} is not a token id", token));
    }
    params.stop_token_ids.push_back(static_cast<TokenId>(token));
  }
  params.ignore_eos = optional_bool(body, "ignore_eos").value_or(false);
  params.skip_special_tokens = optional_bool(body, "skip_special_tokens").value_or(true);
  params.include_stop_str_in_output = optional_bool(body, "include_stop_str_in_output").value_or(false);
  params.logprobs = read_logprobs(body, endpoint, max_logprobs);
  if (endpoint == Endpoint::Completions) params.prompt_logprobs = integer_in_range(body, "prompt_logprobs", 0, max_logprobs);
  return params;
}

void apply_default_max_tokens(SamplingParams& params, std::size_t prompt_tokens, int64_t max_model_len,
                              const GenerationConfig& defaults) {
  if (params.max_tokens || !defaults.max_new_tokens) return;
  const int64_t room = max_model_len - static_cast<int64_t>(prompt_tokens);
  if (room >= 1) params.max_tokens = static_cast<int32_t>(std::min<int64_t>(*defaults.max_new_tokens, room));
}

}  // namespace beamline::server
