#include "server/sglang_generate.h"

#include <fmt/format.h>

#include <map>
#include <string>

#include "server/openai_sampling.h"
#include "server/request_fields.h"
#include "server/routed_experts_json.h"

namespace beamline::server {

namespace {

// SGLang's sampling_params names -> the OpenAI / vLLM fields read_sampling_params takes.
const std::map<std::string, std::string> kSamplingNames = {
    {"max_new_tokens", "max_tokens"},
    {"min_new_tokens", "min_tokens"},
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"top_k", "top_k"},
    {"min_p", "min_p"},
    {"frequency_penalty", "frequency_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"repetition_penalty", "repetition_penalty"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"ignore_eos", "ignore_eos"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"no_stop_trim", "include_stop_str_in_output"},
    {"n", "n"},
    {"sampling_seed", "seed"},
    {"logit_bias", "logit_bias"},
};

std::vector<TokenId> token_ids(const Json& list, const std::string& where, int32_t vocab) {
  if (!list.is_array() || list.empty()) throw invalid_request("input_ids", fmt::format("{}: expected a non-empty list of token ids", where));
  std::vector<TokenId> ids;
  for (const Json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
      throw invalid_request("input_ids", fmt::format("{}: {} is not a token id of this model (vocabulary {})", where,
                                                     id.dump(), vocab));
    }
    ids.push_back(static_cast<TokenId>(id.get<int64_t>()));
  }
  return ids;
}

// The prompts of `input_ids` or `text`, and whether they came as a batch.
std::vector<std::vector<TokenId>> read_prompts(const Json& body, const ServingContext& context, bool& batch) {
  const Json* ids = find_field(body, "input_ids");
  const Json* text = find_field(body, "text");
  if ((ids == nullptr) == (text == nullptr)) {
    throw invalid_request("input_ids", "input_ids: send either input_ids or text (exactly one)");
  }
  std::vector<std::vector<TokenId>> prompts;
  if (ids != nullptr) {
    batch = ids->is_array() && !ids->empty() && (*ids)[0].is_array();
    if (!batch) return {token_ids(*ids, "input_ids", context.engine.vocab_size())};
    for (std::size_t p = 0; p < ids->size(); ++p)
      prompts.push_back(token_ids((*ids)[p], fmt::format("input_ids[{}]", p), context.engine.vocab_size()));
    return prompts;
  }
  batch = text->is_array();
  const auto encode = [&](const Json& item, const std::string& where) {
    if (!item.is_string()) throw invalid_request("text", fmt::format("{}: expected a string, got {}", where, item.type_name()));
    return context.tokenizer.encode(item.get<std::string>(), /*allow_special=*/true);
  };
  if (!batch) return {encode(*text, "text")};
  if (text->empty()) throw invalid_request("text", "text: the list of prompts is empty");
  for (std::size_t p = 0; p < text->size(); ++p) prompts.push_back(encode((*text)[p], fmt::format("text[{}]", p)));
  return prompts;
}

Json finish_reason_json(const SampleOutput& sample) {
  switch (sample.finish_reason.value_or(FinishReason::Abort)) {
    case FinishReason::Length:
      return Json{{"type", "length"}, {"length", sample.token_ids.size()}};
    case FinishReason::Stop: {
      Json matched;
      if (const auto* id = std::get_if<TokenId>(&sample.stop_reason)) {
        matched = *id;
      } else if (const auto* text = std::get_if<std::string>(&sample.stop_reason)) {
        matched = *text;
      } else if (!sample.token_ids.empty()) {
        matched = sample.token_ids.back();  // the end-of-sequence token
      }
      return Json{{"type", "stop"}, {"matched", std::move(matched)}};
    }
    case FinishReason::Abort:
      return Json{{"type", "abort"}};
    case FinishReason::Error:
      return Json{{"type", "error"}};
  }
  return Json();
}

}  // namespace

GeneratePlan plan_generate(const Json& body, const ServingContext& context) {
  if (optional_bool(body, "stream").value_or(false)) {
    throw invalid_request("stream", "stream: /generate answers whole outputs here; stream through /v1/completions");
  }
  GeneratePlan plan;
  Json sampling = Json::object();
  if (const Json* params = find_field(body, "sampling_params")) {
    if (!params->is_object()) throw invalid_request("sampling_params", "sampling_params: expected an object");
    for (const auto& [key, value] : params->items()) {
      const auto name = kSamplingNames.find(key);
      if (name == kSamplingNames.end()) {
        throw invalid_request("sampling_params", fmt::format("sampling_params.{}: not supported by this server", key));
      }
      sampling[name->second] = value;
    }
  }
  plan.return_logprob = optional_bool(body, "return_logprob").value_or(false);
  const bool return_routed_experts = optional_bool(body, "return_routed_experts").value_or(false);
  if (plan.return_logprob) sampling["logprobs"] = optional_integer(body, "top_logprobs_num").value_or(0);
  SamplingParams params;
  try {
    params = read_sampling_params(sampling, Endpoint::Completions, context.engine.config().max_logprobs,
                                  context.generation_config);
  } catch (const ApiError& error) {
    // Named as the request named it.
    std::string param = error.param().value_or("");
    for (const auto& [sglang, openai] : kSamplingNames) {
      if (openai == param) param = "sampling_params." + sglang;
    }
    if (param == "logprobs") param = "top_logprobs_num";
    throw invalid_request(param, fmt::format("{} ({})", error.what(), param));
  }
  for (std::vector<TokenId>& prompt : read_prompts(body, context, plan.batch)) {
    GenerationRequest request;
    request.prompt = std::move(prompt);
    request.sampling = params;
    request.detokenize = true;
    request.return_routed_experts = return_routed_experts;
    apply_default_max_tokens(request.sampling, request.prompt.size(), context.engine.config().max_model_len,
                             context.generation_config);
    plan.requests.push_back(std::move(request));
  }
  return plan;
}

Json generate_response(const ServingContext& context, const GeneratePlan& plan, const std::vector<RequestOutput>& outputs) {
  Json answers = Json::array();
  for (std::size_t p = 0; p < plan.requests.size(); ++p) {
    const RequestOutput& output = outputs.at(p);
    for (const SampleOutput& sample : output.samples) {
      Json meta = {{"id", output.request_id},
                   {"finish_reason", finish_reason_json(sample)},
                   {"prompt_tokens", output.usage.prompt_tokens},
                   {"completion_tokens", sample.token_ids.size()},
                   {"cached_tokens", output.usage.cached_tokens},
                   {kWeightVersionField, context.engine.weight_version()}};
      if (plan.return_logprob) {
        // SGLang's triples: [logprob, token id, text (null unless asked)].
        Json tokens = Json::array(), tops = Json::array();
        for (const TokenLogprob& entry : sample.logprobs) {
          tokens.push_back(Json::array({entry.logprob, entry.token, nullptr}));
          Json top = Json::array();
          for (const auto& [id, logprob] : entry.top) top.push_back(Json::array({logprob, id, nullptr}));
          tops.push_back(std::move(top));
        }
        meta["output_token_logprobs"] = std::move(tokens);
        meta["output_top_logprobs"] = std::move(tops);
      }
      if (plan.requests[p].return_routed_experts)
        meta[kRoutedExpertsField] = routed_experts_base64(sample.routed_experts);
      answers.push_back({{"text", sample.text}, {"output_ids", sample.token_ids}, {"meta_info", std::move(meta)}});
    }
  }
  if (plan.batch || answers.size() != 1) return answers;
  return answers[0];
}

}  // namespace beamline::server
