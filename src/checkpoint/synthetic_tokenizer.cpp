#include "checkpoint/synthetic_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "util/error.h"

namespace beamline {
namespace {

// Training text for the merges: plain English prose with numbers and punctuation, so the learned tokens
// look like those of a real tokenizer (common words, suffixes, leading-space words).
constexpr std::string_view kSampleText = R"(The keeper of the lighthouse kept a small notebook by the window.
Every evening she wrote down the weather, the ships that passed, and the time the lamp was lit.
On the 3rd of March, 1921, the wind turned to the north and the sea grew rough; three boats came
into the harbour before dark, and a fourth one, a fishing boat with a red sail, arrived near midnight.
She counted 12 gulls on the rail that morning and 47 on the rocks by noon. It wasn't unusual.

Learning is a process of noticing patterns. When we read a sentence, we don't look at every letter:
we recognise words, and often whole phrases, because we have seen them many times before. A model that
reads text does something similar. It splits the text into pieces, and the most frequent pieces become
single tokens, while rare words are built from smaller parts. That's why "the", "and" and "of" are cheap,
while a name like Aldebaran or a number like 7,341,905 takes several tokens.

Questions and answers follow a rhythm. What is the capital of France? Paris. How many legs does a spider
have? Eight. Why is the sky blue? Because air scatters short wavelengths of sunlight more than long ones.
Who wrote the letter? We're not sure, but they'd clearly travelled a long way, and they'll be back soon.

In the kitchen, the recipe said: mix 200 g of flour with 2 eggs, add 150 ml of milk, and stir until smooth.
Heat the pan, pour a thin layer, and cook each side for about 30 seconds. Serve warm, with lemon and sugar.

The train left the station at 08:15 and reached the coast by half past ten. Passengers watched fields,
rivers, bridges and villages slide past the windows; children pointed at horses, and an old man read
the newspaper from the first page to the last without looking up once.

Programs are written for people first and machines second. A good function does one thing, has a clear
name, and says what it expects. When something goes wrong, the error message should tell the reader what
happened and where, so that they can fix it without guessing. Tests check the behaviour, not the wiring.

Mountains, forests, deserts and oceans cover the planet in a patchwork of colour. The highest peak rises
about 8,849 metres above the sea, while the deepest trench falls nearly 11,000 metres below it.
Between them live millions of species, most of which nobody has named yet.

She closed the notebook, climbed the stairs, and looked out at the dark water. Somewhere beyond the horizon
another keeper was lighting another lamp, and for a moment the two beams crossed over the waves.
)";

constexpr std::string_view kSplitRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

bool is_letter(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// The o200k split regex restricted to ASCII text (all the sample holds): words with one leading
// non-letter, contractions, digit runs of at most 3, punctuation runs, whitespace.
std::vector<std::string_view> split_ascii(std::string_view text) {
  std::vector<std::string_view> pieces;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    const char c = text[i];
    const bool prefixed_word = !is_letter(c) && !is_digit(c) && c != '\n' && c != '\r' && i + 1 < text.size() &&
                               is_letter(text[i + 1]);
    if (is_letter(c) || prefixed_word) {
      i += prefixed_word ? 1 : 0;
      while (i < text.size() && is_letter(text[i])) ++i;
      for (std::string_view suffix : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"})
        if (text.substr(i).starts_with(suffix)) {
          i += suffix.size();
          break;
        }
    } else if (is_digit(c)) {
      while (i < text.size() && i - start < 3 && is_digit(text[i])) ++i;
    } else if (!is_space(c) || (c == ' ' && i + 1 < text.size() && !is_space(text[i + 1]))) {
      i += c == ' ' ? 1 : 0;
      while (i < text.size() && !is_space(text[i]) && !is_letter(text[i]) && !is_digit(text[i])) ++i;
      while (i < text.size() && (text[i] == '\n' || text[i] == '\r' || text[i] == '/')) ++i;
    } else {
      while (i < text.size() && is_space(text[i])) ++i;
      // A run of spaces before a word leaves its last space to that word (the regex's \s+(?!\S)).
      if (i < text.size() && i - start > 1 && text[i - 1] == ' ') --i;
    }
    pieces.push_back(text.substr(start, i - start));
  }
  return pieces;
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

class BpeVocabulary {
 public:
  BpeVocabulary() {
    for (int byte = 0; byte < 256; ++byte) add(byte_level_spelling(static_cast<uint8_t>(byte)));
  }
  std::size_t size() const { return tokens_.size(); }
  const std::string& token(int id) const { return tokens_[static_cast<std::size_t>(id)]; }
  const std::vector<std::pair<int, int>>& merges() const { return merges_; }

  // Records the merge (left, right) and returns the id of the merged token (new unless already present).
  int merge(int left, int right) {
    merges_.emplace_back(left, right);
    const std::string merged = token(left) + token(right);
    const auto it = ids_.find(merged);
    return it != ids_.end() ? it->second : add(merged);
  }
  bool contains(const std::string& token) const { return ids_.contains(token); }

 private:
  int add(std::string token) {
    const int id = static_cast<int>(tokens_.size());
    ids_.emplace(token, id);
    tokens_.push_back(std::move(token));
    return id;
  }
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int> ids_;
  std::vector<std::pair<int, int>> merges_;
};

// Classic BPE training: repeatedly merge the most frequent adjacent pair (ties: smallest ids) over the
// distinct pieces of the sample, until `target` tokens exist or every piece is a single token.
void learn_merges(BpeVocabulary& vocab, std::size_t target) {
  std::map<std::string_view, int64_t> piece_counts;
  for (std::string_view piece : split_ascii(kSampleText)) ++piece_counts[piece];
  std::vector<std::pair<std::vector<int>, int64_t>> words;
  for (const auto& [piece, count] : piece_counts) {
    std::vector<int> symbols;
    for (char c : piece) symbols.push_back(static_cast<unsigned char>(c));
    words.emplace_back(std::move(symbols), count);
  }
  while (vocab.size() < target) {
    std::map<std::pair<int, int>, int64_t> pair_counts;
    for (const auto& [symbols, count] : words)
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) pair_counts[{symbols[i], symbols[i + 1]}] += count;
    if (pair_counts.empty()) return;
    const auto best = std::max_element(pair_counts.begin(), pair_counts.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    const auto [left, right] = best->first;
    const int merged = vocab.merge(left, right);
    for (auto& [symbols, count] : words) {
      std::vector<int> next;
      for (std::size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(symbols[i]);
        }
      }
      symbols = std::move(next);
    }
  }
}

// Beyond what the sample supports, extend existing tokens by one lowercase letter, in id order.
void add_filler_merges(BpeVocabulary& vocab, std::size_t target) {
  for (std::size_t base = 0; vocab.size() < target; ++base)
    for (char letter = 'a'; letter <= 'z' && vocab.size() < target; ++letter)
      if (!vocab.contains(vocab.token(static_cast<int>(base)) + letter))
        vocab.merge(static_cast<int>(base), static_cast<unsigned char>(letter));
}

}  // namespace

const std::vector<std::string>& harmony_special_tokens() {
  static const std::vector<std::string> tokens = {"<|startoftext|>", "<|endoftext|>", "<|return|>",
                                                  "<|constrain|>",   "<|channel|>",   "<|start|>",
                                                  "<|end|>",         "<|message|>",   "<|call|>"};
  return tokens;
}

int64_t harmony_special_token_id(int64_t vocab_size, std::string_view token) {
  const auto& tokens = harmony_special_tokens();
  const auto it = std::find(tokens.begin(), tokens.end(), token);
  if (it == tokens.end()) fail("\"{}\" is not a Harmony special token", token);
  return vocab_size - static_cast<int64_t>(tokens.size()) + (it - tokens.begin());
}

std::string byte_level_spelling(uint8_t byte) {
  // Printable Latin-1 bytes stand for themselves; the others are shifted past 255, in byte order.
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff); };
  uint32_t code_point = byte;
  if (!printable(byte)) {
    code_point = 256;
    for (int b = 0; b < byte; ++b)
      if (!printable(b)) ++code_point;
  }
  std::string out;
  append_utf8(out, code_point);
  return out;
}

std::string synthetic_tokenizer_json(int64_t vocab_size) {
  require(vocab_size >= kMinSyntheticTokenizerVocab,
          "a byte-level tokenizer needs a vocabulary of at least {} (256 bytes + {} special tokens), not {}",
          kMinSyntheticTokenizerVocab, harmony_special_tokens().size(), vocab_size);
  const auto& specials = harmony_special_tokens();
  const auto target = static_cast<std::size_t>(vocab_size) - specials.size();
  BpeVocabulary vocab;
  learn_merges(vocab, target);
  add_filler_merges(vocab, target);

  using ordered_json = nlohmann::ordered_json;
  ordered_json added_tokens = ordered_json::array();
  for (const std::string& token : specials)
    added_tokens.push_back({{"id", harmony_special_token_id(vocab_size, token)},
                            {"content", token},
                            {"single_word", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"special", true}});
  ordered_json vocab_json = ordered_json::object();
  for (std::size_t id = 0; id < vocab.size(); ++id) vocab_json[vocab.token(static_cast<int>(id))] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : vocab.merges()) merges.push_back({vocab.token(left), vocab.token(right)});

  const ordered_json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added_tokens)},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kSplitRegex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", std::move(vocab_json)},
        {"merges", std::move(merges)}}}};
  return tokenizer.dump(1);
}

}  // namespace beamline
