#include "server/openai_completions.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "server/lora_endpoints.h"
#include "server/openai_chat.h"
#include "server/openai_logprobs.h"
#include "server/request_fields.h"
#include "server/routed_experts_json.h"
#include "server/structured_outputs.h"

namespace beamline::server {

namespace {

bool is_token_list(const Json& value) {
  if (!value.is_array() || value.empty()) return false;
  for (const Json& item : value) {
    if (!item.is_number_integer()) return false;
  }
  return true;
}

std::vector<TokenId> token_list(const Json& value, const std::string& where) {
  std::vector<TokenId> ids;
  for (const Json& item : value) {
    const int64_t id = item.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<TokenId>::max()) {
      throw invalid_request("prompt", fmt::format("{}: {} is not a token id", where, id));
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  return ids;
}

// The prompts of `prompt`: a string, a list of token ids, or a non-empty list of those.
std::vector<const Json*> prompts_of(const Json& body) {
  const Json* prompt = find_field(body, "prompt");
  if (prompt == nullptr) throw invalid_request("prompt", "prompt: missing (a string or a list of token ids is required)");
  if (!prompt->is_array() || is_token_list(*prompt)) return {prompt};
  if (prompt->empty()) throw invalid_request("prompt", "prompt: the list of prompts is empty");
  std::vector<const Json*> prompts;
  for (const Json& item : *prompt) prompts.push_back(&item);
  return prompts;
}

// Sets the prompt ids and text of `plan` from one prompt (`where` names it in errors).
void read_prompt(const Json& single, const std::string& where, const ServingContext& context, CompletionPlan& plan) {
  if (single.is_string()) {
    plan.prompt_text = single.get<std::string>();
    plan.request.prompt = context.tokenizer.encode(plan.prompt_text, /*allow_special=*/true);
    return;
  }
  if (is_token_list(single)) {
    plan.request.prompt = token_list(single, where);
    // The engine rejects ids outside the vocabulary; only known ids can be shown as text.
    const auto vocab = static_cast<TokenId>(context.tokenizer.vocab_size());
    const bool known = std::all_of(plan.request.prompt.begin(), plan.request.prompt.end(),
                                   [&](TokenId id) { return id < vocab; });
    if (known) plan.prompt_text = context.tokenizer.decode(plan.request.prompt);
    return;
  }
  throw invalid_request("prompt", fmt::format("{}: expected a string or a non-empty list of token ids, got {}", where,
                                              single.is_array() ? "an empty or mixed list" : single.type_name()));
}

std::string completion_finish_reason(FinishReason reason) { return std::string(to_string(reason)); }

class CompletionStream : public SseResponder {
 public:
  CompletionStream(std::string id, const ServingContext& context, CompletionPlan plan)
      : id_(std::move(id)),
        context_(context),
        plan_(std::move(plan)),
        created_(unix_seconds_now()),
        text_offsets_(static_cast<std::size_t>(plan_.request.sampling.n), 0),
        prompt_ids_sent_(text_offsets_.size(), false) {}

  std::string begin() override {
    if (!plan_.echo) return "";
    std::string events;
    for (std::size_t i = 0; i < text_offsets_.size(); ++i) {
      events += chunk(i, plan_.prompt_text, nullptr, nullptr, {}, {}, {});
      text_offsets_[i] = plan_.prompt_text.size();
    }
    return events;
  }

  std::string on_output(const RequestOutput& delta) override {
    std::string events;
    for (const SampleOutput& sample : delta.samples) {
      const auto index = static_cast<std::size_t>(sample.index);
      Json logprobs;
      if (plan_.request.sampling.logprobs && !sample.logprobs.empty()) {
        logprobs = completion_logprobs_json(context_.tokenizer, sample.logprobs, text_offsets_.at(index));
      }
      text_offsets_.at(index) += sample.text.size();
      Json finish = sample.finish_reason ? Json(completion_finish_reason(*sample.finish_reason)) : Json();
      if (!sample.text.empty() || !logprobs.is_null() || !finish.is_null() || !sample.token_ids.empty()) {
        events += chunk(index, sample.text, std::move(logprobs), std::move(finish), sample.token_ids,
                        sample.routed_experts, sample.prompt_logprobs);
      }
    }
    if (delta.error) return events + sse_error(internal_error("generation failed: " + *delta.error));
    if (!delta.finished) return events;
    if (plan_.stream.include_usage) {
      Json usage_chunk = base(Json::array());
      usage_chunk["usage"] = usage_json(delta.usage);
      events += sse_event(usage_chunk);
    }
    return events + kSseDone;
  }

 private:
  Json base(Json choices) const {
    return Json{{"id", id_},
                {"object", "text_completion"},
                {"created", created_},
                {"model", response_model(context_, plan_.request)},
                {"choices", std::move(choices)}};
  }

  std::string chunk(std::size_t index, const std::string& text, Json logprobs, Json finish_reason,
                    const std::vector<TokenId>& token_ids, std::span<const int16_t> routed_experts,
                    const std::vector<std::optional<TokenLogprob>>& prompt_logprobs) {
    Json choice = {{"index", index},
                   {"text", text},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", std::move(finish_reason)}};
    if (plan_.return_token_ids) {
      // The prompt's ids go with a choice's first chunk, as vLLM sends them.
      if (!prompt_ids_sent_.at(index)) choice["prompt_token_ids"] = plan_.request.prompt;
      prompt_ids_sent_.at(index) = true;
      choice["token_ids"] = token_ids;
    }
    // The rows of the positions computed since the previous chunk: concatenated, a choice's whole routing.
    if (plan_.request.return_routed_experts) choice[kRoutedExpertsField] = routed_experts_base64(routed_experts);
    // With the first token, as the engine sends them.
    if (!prompt_logprobs.empty()) choice["prompt_logprobs"] = prompt_logprobs_json(context_.tokenizer, prompt_logprobs);
    Json json = base(Json::array({std::move(choice)}));
    if (plan_.stream.include_usage) json["usage"] = nullptr;
    json[kWeightVersionField] = context_.engine.weight_version();
    return sse_event(json);
  }

  std::string id_;
  const ServingContext& context_;
  const CompletionPlan plan_;
  int64_t created_;
  std::vector<std::size_t> text_offsets_;
  std::vector<bool> prompt_ids_sent_;
};

}  // namespace

std::vector<CompletionPlan> plan_completions(const Json& body, const ServingContext& context) {
  const std::string lora_name = requested_model_lora(body, context);
  reject_unsupported_fields(body, Endpoint::Completions);
  CompletionPlan common;
  common.stream = read_stream_options(body);
  common.request.sampling = read_sampling_params(body, Endpoint::Completions, context.engine.config().max_logprobs,
                                                 context.generation_config);
  common.echo = optional_bool(body, "echo").value_or(false);
  if (common.echo && common.request.sampling.logprobs) {
    throw invalid_request("echo", "echo together with logprobs (the prompt's logprobs inside `logprobs`) is not "
                                  "supported; ask for prompt_logprobs instead");
  }
  common.return_token_ids = optional_bool(body, "return_token_ids").value_or(false);
  common.request.return_routed_experts = optional_bool(body, "return_routed_experts").value_or(false);
  common.request.detokenize = true;
  common.request.cache_salt = optional_string(body, "cache_salt").value_or("");
  common.request.lora_name = lora_name;
  common.request.grammar = completion_grammar(body, context);
  // The grammar's end (eos) stops the output even with ignore_eos: what follows could not be in the grammar.
  if (common.request.grammar) {
    std::vector<TokenId>& stops = common.request.sampling.stop_token_ids;
    for (TokenId eos : common.request.grammar->stop_tokens())
      if (std::find(stops.begin(), stops.end(), eos) == stops.end()) stops.push_back(eos);
  }
  const std::vector<const Json*> prompts = prompts_of(body);
  if (common.stream.stream && prompts.size() > 1) {
    throw invalid_request("prompt", fmt::format("prompt: streaming takes one prompt (got {}); send the batch without "
                                                "stream",
                                                prompts.size()));
  }
  std::vector<CompletionPlan> plans;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    CompletionPlan plan = common;
    read_prompt(*prompts[p], prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", p), context, plan);
    apply_default_max_tokens(plan.request.sampling, plan.request.prompt.size(), context.engine.config().max_model_len,
                             context.generation_config);
    plans.push_back(std::move(plan));
  }
  return plans;
}

Json completion_response(const std::string& id, const ServingContext& context, const std::vector<CompletionPlan>& plans,
                         const std::vector<RequestOutput>& outputs) {
  Json choices = Json::array();
  Usage usage;
  for (std::size_t p = 0; p < plans.size(); ++p) {
    const CompletionPlan& plan = plans[p];
    const RequestOutput& output = outputs.at(p);
    const std::string prefix = plan.echo ? plan.prompt_text : "";
    for (const SampleOutput& sample : output.samples) {
      Json logprobs = plan.request.sampling.logprobs
                          ? completion_logprobs_json(context.tokenizer, sample.logprobs, prefix.size())
                          : Json();
      Json choice = {{"index", static_cast<int64_t>(p) * plan.request.sampling.n + sample.index},
                     {"text", prefix + sample.text},
                     {"logprobs", std::move(logprobs)},
                     {"finish_reason", completion_finish_reason(sample.finish_reason.value_or(FinishReason::Abort))}};
      if (plan.return_token_ids) {
        choice["prompt_token_ids"] = plan.request.prompt;
        choice["token_ids"] = sample.token_ids;
      }
      if (plan.request.return_routed_experts) choice[kRoutedExpertsField] = routed_experts_base64(sample.routed_experts);
      if (plan.request.sampling.prompt_logprobs)
        choice["prompt_logprobs"] = prompt_logprobs_json(context.tokenizer, sample.prompt_logprobs);
      choices.push_back(std::move(choice));
    }
    usage.prompt_tokens += output.usage.prompt_tokens;
    usage.completion_tokens += output.usage.completion_tokens;
    usage.cached_tokens += output.usage.cached_tokens;
  }
  return Json{{"id", id},
              {"object", "text_completion"},
              {"created", unix_seconds_now()},
              {"model", response_model(context, plans.front().request)},
              {"choices", std::move(choices)},
              {"usage", usage_json(usage)},
              {kWeightVersionField, context.engine.weight_version()}};
}

std::unique_ptr<SseResponder> completion_stream(const std::string& id, const ServingContext& context,
                                                CompletionPlan plan) {
  return std::make_unique<CompletionStream>(id, context, std::move(plan));
}

}  // namespace beamline::server
