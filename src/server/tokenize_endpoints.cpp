#include "server/tokenize_endpoints.h"

#include <fmt/format.h>

#include "harmony/harmony_render.h"
#include "server/lora_endpoints.h"
#include "server/openai_mapping.h"
#include "server/openai_sampling.h"
#include "server/request_fields.h"

namespace beamline::server {

namespace {

std::vector<TokenId> chat_prompt_ids(const Json& body, const ServingContext& context, bool add_generation_prompt) {
  const Json* messages = find_field(body, "messages");
  if (!messages->is_array() || messages->empty()) {
    throw invalid_request("messages", "messages: expected a non-empty list of messages");
  }
  const harmony::Conversation conversation =
      harmony::conversation_from_chat_request(body, context.harmony_template, harmony::today_utc());
  const harmony::RenderOptions options = context.harmony_template.render_options();
  const harmony::Pieces pieces = add_generation_prompt
                                     ? harmony::render_for_completion(conversation, harmony::Role::Assistant, options)
                                     : harmony::render_conversation(conversation, options);
  return harmony::pieces_to_ids(pieces, context.tokenizer);
}

}  // namespace

Json tokenize_response(const Json& body, const ServingContext& context) {
  requested_model_lora(body, context);
  const bool has_prompt = find_field(body, "prompt") != nullptr;
  const bool has_messages = find_field(body, "messages") != nullptr;
  if (has_prompt == has_messages) {
    throw invalid_request(has_prompt ? "messages" : "prompt", "prompt, messages: exactly one of them is required");
  }
  // vLLM's defaults. The tokenizers served here add no BOS/EOS, so add_special_tokens changes nothing, but
  // its type is still checked.
  const bool add_generation_prompt = optional_bool(body, "add_generation_prompt").value_or(true);
  optional_bool(body, "add_special_tokens");
  const bool return_token_strs = optional_bool(body, "return_token_strs").value_or(false);

  std::vector<TokenId> ids;
  if (has_prompt) {
    auto prompt = optional_string(body, "prompt");
    ids = context.tokenizer.encode(*prompt, /*allow_special=*/true);
  } else {
    ids = chat_prompt_ids(body, context, add_generation_prompt);
  }
  Json response = {{"count", ids.size()}, {"max_model_len", context.engine.config().max_model_len}, {"tokens", ids}};
  if (return_token_strs) {
    Json strs = Json::array();
    for (TokenId id : ids) strs.push_back(context.tokenizer.decode({id}));
    response["token_strs"] = std::move(strs);
  }
  return response;
}

Json detokenize_response(const Json& body, const ServingContext& context) {
  requested_model_lora(body, context);
  if (find_field(body, "tokens") == nullptr) {
    throw invalid_request("tokens", "tokens: missing (a list of token ids is required)");
  }
  const std::vector<int64_t> tokens = integer_list(body, "tokens");
  std::vector<TokenId> ids;
  ids.reserve(tokens.size());
  const auto vocab_size = static_cast<int64_t>(context.tokenizer.vocab_size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    bool known = id >= 0 && id < vocab_size;
    if (known) {
      try {
        context.tokenizer.token_bytes(static_cast<TokenId>(id));  // ids inside the range may still be unassigned
      } catch (const Error&) {
        known = false;
      }
    }
    if (!known) {
      throw invalid_request("tokens", fmt::format("tokens[{}]: {} is not a token id of this model's vocabulary "
                                                  "(size {})",
                                                  i, id, vocab_size));
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  return Json{{"prompt", context.tokenizer.decode(ids)}};
}

std::string beamline_version() { return BEAMLINE_VERSION; }

}  // namespace beamline::server
