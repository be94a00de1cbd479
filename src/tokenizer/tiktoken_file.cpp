// tiktoken rank files: one "<base64 token bytes> <rank>" line per token; the rank is the token id.
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <fstream>
#include <sstream>

#include "tokenizer/bpe_tokenizer.h"
#include "util/base64.h"
#include "util/error.h"

namespace beamline {

namespace {

std::vector<text::AddedToken> o200k_special_tokens(std::string_view encoding) {
  if (encoding == "o200k_base") {
    return {{"<|endoftext|>", 199999, true}, {"<|endofprompt|>", 200018, true}};
  }
  // tiktoken's o200k_harmony: o200k_base's specials, the Harmony tokens, and every other id up to
  // 201087 reserved (so 200018 is both <|endofprompt|> and <|reserved_200018|>).
  std::vector<text::AddedToken> specials = {
      {"<|startoftext|>", 199998, true}, {"<|endoftext|>", 199999, true}, {"<|endofprompt|>", 200018, true},
      {"<|return|>", 200002, true},      {"<|constrain|>", 200003, true}, {"<|channel|>", 200005, true},
      {"<|start|>", 200006, true},       {"<|end|>", 200007, true},       {"<|message|>", 200008, true},
      {"<|call|>", 200012, true}};
  for (TokenId id = 200000; id < 201088; ++id) {
    const bool named = id == 200002 || id == 200003 || (id >= 200005 && id <= 200008) || id == 200012;
    if (!named) specials.push_back({fmt::format("<|reserved_{}|>", id), id, true});
  }
  return specials;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_tiktoken(const std::filesystem::path& ranks, std::string_view encoding) {
  require(encoding == "o200k_base" || encoding == "o200k_harmony",
          "unknown tiktoken encoding \"{}\" (known: o200k_base, o200k_harmony)", encoding);
  const std::string source = ranks.string();
  std::ifstream file(ranks, std::ios::binary);
  require(file.good(), "cannot open tiktoken rank file {}", source);
  std::ostringstream contents;
  contents << file.rdbuf();
  const std::string data = contents.str();

  text::BpeDefinition definition;
  definition.source = source;
  definition.merge_rule = text::BpeDefinition::MergeRule::kTokenRanks;
  definition.whole_piece_lookup = true;
  definition.vocab.reserve(data.size() / 12);
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < data.size();) {
    std::size_t end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    std::string_view line = std::string_view(data).substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    require(space != std::string_view::npos && line.find(' ', space + 1) == std::string_view::npos,
            "{}:{}: expected \"<base64 token> <rank>\"", source, line_number);
    const std::optional<std::string> token = decode_base64(line.substr(0, space));
    require(token.has_value(), "{}:{}: \"{}\" is not valid base64", source, line_number, line.substr(0, space));
    const std::string_view rank_text = line.substr(space + 1);
    TokenId rank = -1;
    const auto [end_of_number, error] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    require(error == std::errc() && end_of_number == rank_text.data() + rank_text.size() && rank >= 0,
            "{}:{}: rank \"{}\" is not a non-negative integer", source, line_number, rank_text);
    definition.vocab.emplace_back(std::move(*token), rank);
  }
  require(!definition.vocab.empty(), "{}: no tokens in the rank file", source);
  definition.added_tokens = o200k_special_tokens(encoding);
  definition.pre_tokenizer = text::make_pretokenizer(text::kO200kPattern, source);
  return text::make_bpe_tokenizer(std::move(definition));
}

}  // namespace beamline
