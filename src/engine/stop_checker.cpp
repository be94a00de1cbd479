#include "engine/stop_checker.h"

#include <algorithm>

namespace beamline {

StopChecker::StopChecker(const Tokenizer* tokenizer, bool detokenize, const SamplingParams& params,
                         std::span<const TokenId> eos_token_ids, int32_t max_tokens)
    : tokenizer_(tokenizer), params_(params), stop_ids_(params.stop_token_ids), max_tokens_(max_tokens) {
  if (detokenize && tokenizer) detokenizer_.emplace(*tokenizer);
  min_tokens_mask_ = stop_ids_;
  min_tokens_mask_.insert(min_tokens_mask_.end(), eos_token_ids.begin(), eos_token_ids.end());
  if (!params.ignore_eos) stop_ids_.insert(stop_ids_.end(), eos_token_ids.begin(), eos_token_ids.end());
  for (const std::string& stop : params.stop) longest_stop_ = std::max(longest_stop_, stop.size());
}

bool StopChecker::is_stop_token(TokenId token) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
}

std::span<const TokenId> StopChecker::masked_tokens(int32_t num_output_tokens) const {
  if (num_output_tokens >= params_.min_tokens) return {};
  return min_tokens_mask_;
}

std::string StopChecker::take_text(std::size_t end) {
  if (end <= emitted_) return {};
  std::string piece = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return piece;
}

StopChecker::Result StopChecker::push(TokenId token, int32_t num_output_tokens) {
  Result result;
  if (is_stop_token(token) && num_output_tokens > params_.min_tokens - 1) {
    // The stop token adds no text; whatever was held back is now final.
    if (detokenizer_) text_ += detokenizer_->flush();
    result.finish = FinishReason::Stop;
    if (std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) != params_.stop_token_ids.end()) {
      result.stop_reason = token;
    }
    result.text = take_text(text_.size());
    return result;
  }

  const std::size_t searched_until = text_.size();
  if (detokenizer_ && !(params_.skip_special_tokens && tokenizer_->is_special(token))) {
    text_ += detokenizer_->push(token);
  }
  if (!params_.stop.empty() && text_.size() > searched_until) {
    // A new match must end in the new text, so it starts at most longest_stop_ - 1 bytes before it.
    const std::size_t from = searched_until > longest_stop_ - 1 ? searched_until - (longest_stop_ - 1) : 0;
    std::size_t match = std::string::npos;
    const std::string* matched = nullptr;
    for (const std::string& stop : params_.stop) {
      const std::size_t at = text_.find(stop, from);
      if (at != std::string::npos && (match == std::string::npos || at < match)) {
        match = at;
        matched = &stop;
      }
    }
    if (matched) {
      text_.resize(match + (params_.include_stop_str_in_output ? matched->size() : 0));
      result.finish = FinishReason::Stop;
      result.stop_reason = *matched;
      result.text = take_text(text_.size());
      return result;
    }
  }
  if (num_output_tokens >= max_tokens_) {
    if (detokenizer_) text_ += detokenizer_->flush();
    result.finish = FinishReason::Length;
    result.text = take_text(text_.size());
    return result;
  }
  const std::size_t hold = params_.stop.empty() ? 0 : longest_stop_ - 1;
  std::size_t end = text_.size() > hold ? text_.size() - hold : 0;
  while (end > emitted_ && end < text_.size() && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) --end;
  result.text = take_text(end);
  return result;
}

}  // namespace beamline
