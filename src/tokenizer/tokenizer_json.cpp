// Hugging Face tokenizer.json with a byte-level BPE model (the format gpt-oss ships).
#include <nlohmann/json.hpp>

#include <array>
#include <cctype>
#include <fstream>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beamline {

namespace {

using nlohmann::json;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes for the code
// points 256, 257, ... in byte order, so every vocabulary string is printable.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet() {
    byte_of_.fill(-1);
    char32_t next_extra = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      byte_of_[printable ? byte : next_extra++] = static_cast<int16_t>(byte);
    }
  }

  // Raw bytes of a vocabulary string; nullopt when it has a character outside the alphabet.
  std::optional<std::string> to_bytes(std::string_view mapped) const {
    std::string out;
    out.reserve(mapped.size());
    const auto* p = reinterpret_cast<const unsigned char*>(mapped.data());
    const auto* end = p + mapped.size();
    while (p < end) {
      const text::Utf8Char c = text::decode_utf8(p, end);
      if (c.code_point >= byte_of_.size() || byte_of_[c.code_point] < 0) return std::nullopt;
      out += static_cast<char>(byte_of_[c.code_point]);
      p += c.length;
    }
    return out;
  }

 private:
  std::array<int16_t, 324> byte_of_;
};

class TokenizerJsonReader {
 public:
  explicit TokenizerJsonReader(const std::filesystem::path& path) : source_(path.string()) {
    std::ifstream file(path, std::ios::binary);
    require(file.good(), "cannot open tokenizer file {}", source_);
    try {
      root_ = json::parse(file);
    } catch (const json::exception& error) {
      fail("{}: not valid JSON: {}", source_, error.what());
    }
    require(root_.is_object(), "{}: the top level is not a JSON object", source_);
  }

  std::unique_ptr<Tokenizer> read() {
    text::BpeDefinition definition;
    definition.source = source_;
    const json& normalizer = root_.value("normalizer", json());
    if (!normalizer.is_null()) {
      // The type names the normalizer when it is a string; anything else is shown as it is (a non-string type
      // used to escape as nlohmann's type_error, found by tests/fuzz/fuzz_tokenizer_json).
      const bool named = normalizer.is_object() && normalizer.contains("type") && normalizer.at("type").is_string();
      fail("{}: normalizer {} is not supported (only null)", source_,
           named ? "of type " + normalizer.at("type").get<std::string>() : normalizer.dump());
    }
    read_model(definition);
    read_pre_tokenizer(definition);
    read_added_tokens(definition);
    return text::make_bpe_tokenizer(std::move(definition));
  }

 private:
  const json& member(const json& object, const char* key, const std::string& where) const {
    require(object.is_object() && object.contains(key), "{}: {} has no \"{}\"", source_, where, key);
    return object.at(key);
  }

  std::string string_member(const json& object, const char* key, const std::string& where) const {
    const json& value = member(object, key, where);
    require(value.is_string(), "{}: {}.{} is not a string", source_, where, key);
    return value.get<std::string>();
  }

  bool bool_member(const json& object, const char* key, bool fallback, const std::string& where) const {
    if (!object.contains(key) || object.at(key).is_null()) return fallback;
    require(object.at(key).is_boolean(), "{}: {}.{} is not a boolean", source_, where, key);
    return object.at(key).get<bool>();
  }

  std::string mapped_to_bytes(const std::string& mapped, const std::string& where) const {
    std::optional<std::string> bytes = alphabet_.to_bytes(mapped);
    require(bytes.has_value(), "{}: {} \"{}\" has a character outside the byte-level alphabet", source_, where, mapped);
    require(!bytes->empty(), "{}: {} is empty", source_, where);
    return std::move(*bytes);
  }

  void read_model(text::BpeDefinition& definition) const {
    const json& model = member(root_, "model", "the file");
    require(model.is_object(), "{}: model is not an object", source_);
    const std::string type = model.contains("type") ? string_member(model, "type", "model") : "BPE";
    require(type == "BPE", "{}: model.type is \"{}\"; only BPE is supported", source_, type);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      require(!model.contains(key) || model.at(key).is_null() || model.at(key) == "",
              "{}: model.{} is not supported by byte-level BPE", source_, key);
    }
    definition.whole_piece_lookup = bool_member(model, "ignore_merges", false, "model");

    const json& vocab = member(model, "vocab", "model");
    require(vocab.is_object(), "{}: model.vocab is not an object", source_);
    definition.vocab.reserve(vocab.size());
    for (const auto& [mapped, id] : vocab.items()) {
      const std::string where = "model.vocab[\"" + mapped + "\"]";
      require(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
              "{}: {} is not a token id (a non-negative integer)", source_, where);
      definition.vocab.emplace_back(mapped_to_bytes(mapped, "model.vocab key"), id.get<TokenId>());
    }

    const json& merges = member(model, "merges", "model");
    require(merges.is_array(), "{}: model.merges is not an array", source_);
    definition.merges.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json& merge = merges[i];
      const std::string where = "model.merges[" + std::to_string(i) + "]";
      std::string left, right;
      if (merge.is_string()) {
        const std::string text = merge.get<std::string>();
        const std::size_t space = text.find(' ');
        require(space != std::string::npos && text.find(' ', space + 1) == std::string::npos,
                "{}: {} \"{}\" is not two tokens separated by one space", source_, where, text);
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else {
        require(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
                "{}: {} is neither \"a b\" nor [\"a\", \"b\"]", source_, where);
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      }
      definition.merges.emplace_back(mapped_to_bytes(left, where), mapped_to_bytes(right, where));
    }
  }

  // Byte-level tokenizers have a ByteLevel step, alone or after Split steps in a Sequence.
  void read_pre_tokenizer(text::BpeDefinition& definition) const {
    const json& pre_tokenizer = root_.value("pre_tokenizer", json());
    require(pre_tokenizer.is_object(), "{}: pre_tokenizer is missing; only byte-level BPE is supported", source_);
    std::vector<std::pair<const json*, std::string>> steps;
    const std::string type = string_member(pre_tokenizer, "type", "pre_tokenizer");
    if (type == "Sequence") {
      const json& list = member(pre_tokenizer, "pretokenizers", "pre_tokenizer");
      require(list.is_array(), "{}: pre_tokenizer.pretokenizers is not an array", source_);
      for (std::size_t i = 0; i < list.size(); ++i) {
        steps.emplace_back(&list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
      }
    } else {
      steps.emplace_back(&pre_tokenizer, "pre_tokenizer");
    }
    std::vector<std::unique_ptr<text::PreTokenizer>> splitters;
    bool byte_level = false;
    for (const auto& [step, where] : steps) {
      const std::string step_type = string_member(*step, "type", where);
      if (step_type == "Split") {
        require(!byte_level, "{}: {}: a Split after ByteLevel is not supported", source_, where);
        splitters.push_back(read_split(*step, where));
      } else if (step_type == "ByteLevel") {
        require(!byte_level, "{}: {}: a second ByteLevel step", source_, where);
        byte_level = true;
        definition.add_prefix_space = bool_member(*step, "add_prefix_space", false, where);
        if (bool_member(*step, "use_regex", true, where)) {
          splitters.push_back(text::make_pretokenizer(text::kGpt2Pattern, source_ + ": " + where));
        }
      } else {
        fail("{}: {}.type \"{}\" is not supported (Split and ByteLevel are)", source_, where, step_type);
      }
    }
    require(byte_level, "{}: pre_tokenizer has no ByteLevel step; only byte-level BPE is supported", source_);
    definition.pre_tokenizer = text::make_pretokenizer_sequence(std::move(splitters));
  }

  std::unique_ptr<text::PreTokenizer> read_split(const json& split, const std::string& where) const {
    const std::string behavior = string_member(split, "behavior", where);
    require(behavior == "Isolated", "{}: {}.behavior \"{}\" is not supported (only Isolated)", source_, where, behavior);
    require(!bool_member(split, "invert", false, where), "{}: {}.invert true is not supported", source_, where);
    const json& pattern = member(split, "pattern", where);
    const std::string pattern_where = source_ + ": " + where + ".pattern";
    if (pattern.contains("Regex")) {
      return text::make_pretokenizer(string_member(pattern, "Regex", where + ".pattern"), pattern_where);
    }
    // A literal: every ASCII punctuation character escaped.
    const std::string literal = string_member(pattern, "String", where + ".pattern");
    std::string escaped;
    for (const char c : literal) {
      if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) escaped += '\\';
      escaped += c;
    }
    return text::make_regex_pretokenizer(escaped, pattern_where);
  }

  void read_added_tokens(text::BpeDefinition& definition) const {
    const json& added = root_.value("added_tokens", json::array());
    require(added.is_array(), "{}: added_tokens is not an array", source_);
    for (std::size_t i = 0; i < added.size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json& token = added[i];
      const json& id = member(token, "id", where);
      require(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
              "{}: {}.id is not a token id (a non-negative integer)", source_, where);
      definition.added_tokens.push_back(
          {string_member(token, "content", where), id.get<TokenId>(), bool_member(token, "special", false, where)});
    }
  }

  std::string source_;
  json root_;
  ByteLevelAlphabet alphabet_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_tokenizer_json(const std::filesystem::path& path) {
  return TokenizerJsonReader(path).read();
}

}  // namespace beamline
