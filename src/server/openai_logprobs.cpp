#include "server/openai_logprobs.h"

#include <algorithm>

namespace beamline::server {

namespace {

Json token_bytes_json(const Tokenizer& tokenizer, TokenId id) {
  Json bytes = Json::array();
  for (char byte : tokenizer.token_bytes(id)) bytes.push_back(static_cast<unsigned char>(byte));
  return bytes;
}

// A token the grammar masked has logprob -inf, which JSON cannot hold (nlohmann writes null): vLLM's -9999.0 instead.
double json_logprob(float logprob) { return std::max(static_cast<double>(logprob), -9999.0); }

}  // namespace

std::string token_text(const Tokenizer& tokenizer, TokenId id) { return tokenizer.decode({id}); }

Json chat_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& logprobs) {
  Json content = Json::array();
  for (const TokenLogprob& entry : logprobs) {
    Json top = Json::array();
    for (const auto& [token, logprob] : entry.top) {
      top.push_back(
          {{"token", token_text(tokenizer, token)}, {"logprob", json_logprob(logprob)}, {"bytes", token_bytes_json(tokenizer, token)}});
    }
    content.push_back({{"token", token_text(tokenizer, entry.token)},
                       {"logprob", json_logprob(entry.logprob)},
                       {"bytes", token_bytes_json(tokenizer, entry.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}};
}

Json completion_logprobs_json(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& logprobs,
                              std::size_t text_offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(), offsets = Json::array();
  std::size_t offset = text_offset;
  for (const TokenLogprob& entry : logprobs) {
    const std::string text = token_text(tokenizer, entry.token);
    tokens.push_back(text);
    token_logprobs.push_back(json_logprob(entry.logprob));
    Json top = Json::object();
    for (const auto& [token, logprob] : entry.top) top[token_text(tokenizer, token)] = json_logprob(logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset);
    offset += text.size();
  }
  return Json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

Json prompt_logprobs_json(const Tokenizer& tokenizer, const std::vector<std::optional<TokenLogprob>>& logprobs) {
  Json entries = Json::array();
  for (const std::optional<TokenLogprob>& entry : logprobs) {
    if (!entry) {
      entries.push_back(nullptr);
      continue;
    }
    Json tokens = Json::object();
    auto add = [&](TokenId id, float logprob, int32_t rank) {
      tokens[std::to_string(id)] = {{"logprob", json_logprob(logprob)}, {"rank", rank},
                                    {"decoded_token", token_text(tokenizer, id)}};
    };
    for (std::size_t j = 0; j < entry->top.size(); ++j)
      add(entry->top[j].first, entry->top[j].second, static_cast<int32_t>(j) + 1);
    add(entry->token, entry->logprob, entry->rank);
    entries.push_back(std::move(tokens));
  }
  return entries;
}

}  // namespace beamline::server
