#include "token_list.h"

#include <charconv>

#include "util/error.h"

namespace beamline::cli {

std::vector<int32_t> parse_token_list(std::string_view text, int64_t vocab_size, std::string_view option) {
  std::vector<int32_t> tokens;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string_view entry = text.substr(at, comma - at);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    const std::size_t index = tokens.size();
    require(!entry.empty(), "{}: empty entry at index {} in \"{}\"", option, index, text);
    int64_t value = 0;
    const auto [end, error] = std::from_chars(entry.data(), entry.data() + entry.size(), value);
    require(error == std::errc() && end == entry.data() + entry.size(),
            "{}: \"{}\" at index {} is not a token id (a non-negative integer)", option, entry, index);
    require(value >= 0 && value < vocab_size, "{}: token id {} at index {} is outside the vocabulary of {}", option,
            value, index, vocab_size);
    tokens.push_back(static_cast<int32_t>(value));
    at = comma + 1;
  }
  return tokens;
}

}  // namespace beamline::cli
