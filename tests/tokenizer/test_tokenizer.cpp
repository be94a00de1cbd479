#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beamline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path scratch_dir() {
  const fs::path dir = fs::temp_directory_path() / ("beamline_test_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

fs::path write_file(const std::string& name, const std::string& contents) {
  const fs::path path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

// GPT-2's byte-to-character mapping, written out independently of the loader.
std::string byte_level(std::string_view bytes) {
  std::vector<char32_t> map(256);
  char32_t extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    map[b] = printable ? static_cast<char32_t>(b) : extra++;
  }
  std::string out;
  for (const char c : bytes) text::append_utf8(out, map[static_cast<unsigned char>(c)]);
  return out;
}

// tiktoken's / Hugging Face's merging, naively: parts as strings, rescanning every pair each step.
std::vector<std::string> naive_merge(const std::string& piece,
                                     const std::function<std::optional<uint64_t>(const std::string&, const std::string&)>& rank) {
  std::vector<std::string> parts;
  for (const char c : piece) parts.emplace_back(1, c);
  for (;;) {
    std::optional<uint64_t> best;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto r = rank(parts[i], parts[i + 1]);
      if (r && (!best || *r < *best)) {
        best = r;
        best_at = i;
      }
    }
    if (!best) return parts;
    parts[best_at] += parts[best_at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
}

std::vector<std::string> split(const text::PreTokenizer& pre_tokenizer, std::string_view text) {
  std::vector<std::size_t> ends;
  pre_tokenizer.split(text, ends);
  std::vector<std::string> pieces;
  std::size_t start = 0;
  for (const std::size_t end : ends) {
    pieces.emplace_back(text.substr(start, end - start));
    start = end;
  }
  return pieces;
}

// A random merge list over a small alphabet, so merges interact a lot: each merge joins two tokens that
// exist already.
struct RandomBpe {
  std::vector<std::string> tokens;  // id -> bytes; ids 0..255 are the bytes
  std::vector<std::pair<std::string, std::string>> merges;
};

RandomBpe random_bpe(std::mt19937& rng, std::string_view alphabet, int merge_count) {
  RandomBpe bpe;
  for (int b = 0; b < 256; ++b) bpe.tokens.emplace_back(1, static_cast<char>(b));
  std::vector<std::string> pool;
  for (const char c : alphabet) pool.emplace_back(1, c);
  std::map<std::string, bool> known;
  for (const auto& t : bpe.tokens) known[t] = true;
  while (static_cast<int>(bpe.merges.size()) < merge_count) {
    const std::string& a = pool[rng() % pool.size()];
    const std::string& b = pool[rng() % pool.size()];
    const std::string joined = a + b;
    if (joined.size() > 8 || known.count(joined)) continue;
    known[joined] = true;
    bpe.merges.emplace_back(a, b);
    bpe.tokens.push_back(joined);
    pool.push_back(joined);
  }
  return bpe;
}

json tokenizer_json(const RandomBpe& bpe, const json& pre_tokenizer, const json& added_tokens, bool pairs_as_arrays) {
  json vocab = json::object();
  for (std::size_t id = 0; id < bpe.tokens.size(); ++id) vocab[byte_level(bpe.tokens[id])] = id;
  json merges = json::array();
  for (const auto& [a, b] : bpe.merges) {
    if (pairs_as_arrays) {
      merges.push_back(json::array({byte_level(a), byte_level(b)}));
    } else {
      merges.push_back(byte_level(a) + " " + byte_level(b));
    }
  }
  return json{{"version", "1.0"},
              {"added_tokens", added_tokens},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}}}};
}

json o200k_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"},
                         {"pattern", {{"Regex", std::string(text::kO200kPattern)}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

std::string random_text(std::mt19937& rng, std::string_view alphabet, std::size_t max_length) {
  std::string text;
  const std::size_t length = rng() % (max_length + 1);
  for (std::size_t i = 0; i < length; ++i) text += alphabet[rng() % alphabet.size()];
  return text;
}

std::string random_bytes(std::mt19937& rng, std::size_t max_length) {
  std::string bytes;
  const std::size_t length = rng() % (max_length + 1);
  for (std::size_t i = 0; i < length; ++i) bytes += static_cast<char>(rng() % 256);
  return bytes;
}

// Random text drawn from every class the o200k pattern distinguishes, plus broken UTF-8.
std::string random_unicode(std::mt19937& rng, std::size_t max_length) {
  static const std::vector<char32_t> samples = {
      'a', 'Z', 'q', 'I', '0', '7', ' ', ' ', '\t', '\n', '\r', '\'', 's', 'S', 't', 'l', 'L', 'r', 'e', 'v', 'd', 'm',
      '/', '!', '.', '-', 0x0B, 0x0C, 0x85, 0xA0, 0x17F, 0x1C5, 0x2B0, 0x301, 0x300, 0x345, 0x3A3, 0x3C3, 0x416, 0x436,
      0x5D0, 0x627, 0x64B, 0x660, 0x915, 0x93F, 0x94D, 0x966, 0xE01, 0xE31, 0x1680, 0x180E, 0x2003, 0x200B, 0x200D,
      0x2028, 0x2029, 0x202F, 0x205F, 0x2160, 0x2460, 0x3000, 0x3042, 0x4E2D, 0xAC00, 0xFE0F, 0xFEFF, 0xFF11, 0xFF21,
      0x1D400, 0x1F600, 0x1F3FD, 0x10400, 0x10428, 0xE0100};
  std::string text;
  const std::size_t length = rng() % (max_length + 1);
  for (std::size_t i = 0; i < length; ++i) {
    const unsigned roll = rng() % 100;
    if (roll < 4) {
      static const char* broken[] = {"\xE2\x82", "\xC3", "\x80", "\xFF", "\xF0\x9F\x98", "\xED\xA0\x80", "\xE0\x80"};
      text += broken[rng() % 7];
    } else {
      text::append_utf8(text, samples[rng() % samples.size()]);
    }
  }
  return text;
}

// ---------------------------------------------------------------------------------------------------------------
// Pre-tokenization

TEST(O200kSplitter, MatchesPcre2OnRandomText) {
  const auto reference = text::make_regex_pretokenizer(text::kO200kPattern, "test");
  const auto fast = text::make_pretokenizer(text::kO200kPattern, "test");
  const auto reference_spelled = text::make_regex_pretokenizer(text::kO200kPatternSpelledOut, "test");
  const auto fast_spelled = text::make_pretokenizer(text::kO200kPatternSpelledOut, "test");
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20000; ++trial) {
    const std::string input = random_unicode(rng, 24);
    ASSERT_EQ(split(*fast, input), split(*reference, input)) << "input " << text::replace_invalid_utf8(input);
    ASSERT_EQ(split(*fast_spelled, input), split(*reference_spelled, input)) << "input " << input;
  }
}

TEST(O200kSplitter, KnownSplits) {
  const auto splitter = text::make_pretokenizer(text::kO200kPattern, "test");
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(split(*splitter, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split(*splitter, "I'M here, they'LL go"), (Pieces{"I'M", " here", ",", " they'LL", " go"}));
  EXPECT_EQ(split(*splitter, "abc12345"), (Pieces{"abc", "123", "45"}));
  EXPECT_EQ(split(*splitter, "a   b\n\n c"), (Pieces{"a", "  ", " b", "\n\n", " c"}));
  EXPECT_EQ(split(*splitter, "x  "), (Pieces{"x", "  "}));
  EXPECT_EQ(split(*splitter, " ?!//\n\nq"), (Pieces{" ?!//\n\n", "q"}));
  EXPECT_EQ(split(*splitter, "CamelCaseWORD"), (Pieces{"Camel", "Case", "WORD"}));
  EXPECT_EQ(split(*splitter, "don'\xC5\xBF"), (Pieces{"don'\xC5\xBF"}));  // (?i:'s) matches the long s
  const auto spelled = text::make_pretokenizer(text::kO200kPatternSpelledOut, "test");
  EXPECT_EQ(split(*spelled, "don'\xC5\xBF"), (Pieces{"don", "'\xC5\xBF"}));
}

// Malformed UTF-8 is split exactly as its lossy decoding (each maximal invalid subpart one U+FFFD) would be.
TEST(O200kSplitter, InvalidUtf8SplitsLikeItsLossyDecoding) {
  const auto splitter = text::make_pretokenizer(text::kO200kPattern, "test");
  std::mt19937 rng(99);
  for (int trial = 0; trial < 5000; ++trial) {
    const std::string input = trial % 2 ? random_bytes(rng, 20) : random_unicode(rng, 20);
    std::vector<std::string> lossy_of_pieces;
    for (const std::string& piece : split(*splitter, input)) lossy_of_pieces.push_back(text::replace_invalid_utf8(piece));
    ASSERT_EQ(lossy_of_pieces, split(*splitter, text::replace_invalid_utf8(input)));
  }
}

TEST(RegexSplitter, GapsBetweenMatchesArePieces) {
  const auto splitter = text::make_regex_pretokenizer("[0-9]+", "test");
  EXPECT_EQ(split(*splitter, "ab12cd3"), (std::vector<std::string>{"ab", "12", "cd", "3"}));
  EXPECT_THROW(text::make_regex_pretokenizer("(unclosed", "test"), Error);
}

// ---------------------------------------------------------------------------------------------------------------
// tokenizer.json

TEST(TokenizerJson, TinyHandMadeMerges) {
  RandomBpe bpe;
  for (int b = 0; b < 256; ++b) bpe.tokens.emplace_back(1, static_cast<char>(b));
  bpe.merges = {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}};
  for (const auto& [a, b] : bpe.merges) bpe.tokens.push_back(a + b);
  const fs::path path = write_file("tiny.json", tokenizer_json(bpe, o200k_pre_tokenizer(), json::array(), false).dump());
  const auto tokenizer = Tokenizer::from_tokenizer_json(path);
  const auto id = [&](const std::string& token) { return *tokenizer->token_to_id(token); };
  EXPECT_EQ(tokenizer->encode("hello"), (std::vector<TokenId>{id("hello")}));
  EXPECT_EQ(tokenizer->encode("hello world"),
            (std::vector<TokenId>{id("hello"), id(" w"), id("or"), id("l"), id("d")}));
  EXPECT_EQ(tokenizer->encode("hellx"), (std::vector<TokenId>{id("hell"), id("x")}));
  EXPECT_EQ(tokenizer->encode("ehll"), (std::vector<TokenId>{id("e"), id("h"), id("ll")}));
  EXPECT_EQ(tokenizer->vocab_size(), 262u);
  EXPECT_EQ(tokenizer->token_bytes(id("hello")), "hello");
  EXPECT_FALSE(tokenizer->token_to_id("hel").has_value());
}

TEST(TokenizerJson, MatchesNaiveMergingOnRandomText) {
  std::mt19937 rng(7);
  const std::string alphabet = "abcde \n'AB1";
  const RandomBpe bpe = random_bpe(rng, alphabet, 300);
  std::map<std::pair<std::string, std::string>, uint64_t> rank;
  for (std::size_t i = 0; i < bpe.merges.size(); ++i) rank.try_emplace(bpe.merges[i], i);
  std::map<std::string, TokenId> id_of;
  for (std::size_t id = 0; id < bpe.tokens.size(); ++id) id_of[bpe.tokens[id]] = static_cast<TokenId>(id);
  const json gpt2_pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  for (const json& pre_tokenizer : {o200k_pre_tokenizer(), gpt2_pre_tokenizer}) {
    const bool arrays = pre_tokenizer == gpt2_pre_tokenizer;
    const fs::path path = write_file("random.json", tokenizer_json(bpe, pre_tokenizer, json::array(), arrays).dump());
    const auto tokenizer = Tokenizer::from_tokenizer_json(path);
    const auto reference_splitter = text::make_regex_pretokenizer(
        pre_tokenizer == gpt2_pre_tokenizer ? text::kGpt2Pattern : text::kO200kPattern, "test");
    for (int trial = 0; trial < 3000; ++trial) {
      const std::string input = random_text(rng, alphabet, 40);
      std::vector<TokenId> expected;
      for (const std::string& piece : split(*reference_splitter, input)) {
        const auto parts = naive_merge(piece, [&](const std::string& a, const std::string& b) -> std::optional<uint64_t> {
          const auto it = rank.find({a, b});
          return it == rank.end() ? std::nullopt : std::optional<uint64_t>(it->second);
        });
        for (const std::string& part : parts) expected.push_back(id_of.at(part));
      }
      ASSERT_EQ(tokenizer->encode(input), expected) << "input \"" << input << "\"";
    }
  }
}

TEST(TokenizerJson, SpecialTokensOnlyWhenAllowed) {
  RandomBpe bpe;
  for (int b = 0; b < 256; ++b) bpe.tokens.emplace_back(1, static_cast<char>(b));
  const json added = json::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}},
                                  {{"id", 301}, {"content", "<|end|>x"}, {"special", true}},
                                  {{"id", 302}, {"content", "[sep]"}, {"special", false}}});
  const fs::path path = write_file("specials.json", tokenizer_json(bpe, o200k_pre_tokenizer(), added, false).dump());
  const auto tokenizer = Tokenizer::from_tokenizer_json(path);
  const std::string text = "a<|end|>b<|end|>x[sep]";
  const std::vector<TokenId> allowed = tokenizer->encode(text, true);
  EXPECT_EQ(allowed, (std::vector<TokenId>{'a', 300, 'b', 301, 302}));  // longest special wins at a position
  const std::vector<TokenId> plain = tokenizer->encode(text, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 300), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 302), 1);  // non-special added tokens always match
  EXPECT_EQ(tokenizer->decode(plain), text);
  EXPECT_EQ(tokenizer->decode(allowed), text);
  EXPECT_TRUE(tokenizer->is_special(300));
  EXPECT_FALSE(tokenizer->is_special(302));
  EXPECT_FALSE(tokenizer->is_special('a'));
  EXPECT_EQ(tokenizer->token_to_id("<|end|>"), 300);
  EXPECT_EQ(tokenizer->vocab_size(), 303u);
}

TEST(TokenizerJson, RoundTripsArbitraryBytesAndRejectsUnknownIds) {
  std::mt19937 rng(5);
  const RandomBpe bpe = random_bpe(rng, "ab \xC3\xA9\xE4\xB8\xAD", 200);
  const fs::path path = write_file("roundtrip.json", tokenizer_json(bpe, o200k_pre_tokenizer(), json::array(), false).dump());
  const auto tokenizer = Tokenizer::from_tokenizer_json(path);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string input = trial % 2 ? random_bytes(rng, 30) : random_unicode(rng, 30);
    ASSERT_EQ(tokenizer->decode_bytes(tokenizer->encode(input)), input);
    ASSERT_EQ(tokenizer->decode(tokenizer->encode(input)), text::replace_invalid_utf8(input));
  }
  try {
    tokenizer->decode_bytes({1, 2, 999999});
    FAIL() << "no error for an unknown id";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("999999"), std::string::npos) << error.what();
  }
  EXPECT_THROW(tokenizer->decode({-1}), Error);
}

void expect_load_error(const std::function<void()>& load, const std::vector<std::string>& fragments) {
  try {
    load();
    FAIL() << "no error";
  } catch (const Error& error) {
    for (const std::string& fragment : fragments) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
          << "\"" << error.what() << "\" lacks \"" << fragment << "\"";
    }
  }
}

TEST(TokenizerJson, BrokenFilesNameTheProblem) {
  RandomBpe bpe;
  for (int b = 0; b < 256; ++b) bpe.tokens.emplace_back(1, static_cast<char>(b));
  bpe.merges = {{"a", "b"}};
  bpe.tokens.push_back("ab");
  const json good = tokenizer_json(bpe, o200k_pre_tokenizer(), json::array(), false);
  const auto load = [](const std::string& name, const std::string& contents) {
    return [name, contents] { Tokenizer::from_tokenizer_json(write_file(name, contents)); };
  };
  expect_load_error([] { Tokenizer::from_tokenizer_json("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json"});
  expect_load_error(load("not_json.json", "{\"model\": "), {"not_json.json", "JSON"});
  json no_model = good;
  no_model.erase("model");
  expect_load_error(load("no_model.json", no_model.dump()), {"no_model.json", "\"model\""});
  json unknown_merge = good;
  unknown_merge["model"]["merges"].push_back("a zz");
  expect_load_error(load("unknown_merge.json", unknown_merge.dump()), {"unknown_merge.json", "merges[1]", "zz"});
  json bad_merge = good;
  bad_merge["model"]["merges"].push_back("abc");
  expect_load_error(load("bad_merge.json", bad_merge.dump()), {"bad_merge.json", "merges[1]"});
  json bad_char = good;
  bad_char["model"]["vocab"]["\xE4\xB8\xAD"] = 400;
  expect_load_error(load("bad_char.json", bad_char.dump()), {"bad_char.json", "model.vocab", "byte-level"});
  json bad_id = good;
  bad_id["model"]["vocab"]["zz"] = "x";
  expect_load_error(load("bad_id.json", bad_id.dump()), {"bad_id.json", "zz"});
  json duplicate_id = good;
  duplicate_id["model"]["vocab"]["zz"] = 3;
  expect_load_error(load("duplicate_id.json", duplicate_id.dump()), {"duplicate_id.json", "id 3"});
  // Found by tests/fuzz/fuzz_tokenizer_json: an id near 2^31 sized the id tables at 16 GiB; a normalizer type that is
  // not a string escaped as nlohmann's type_error.
  json huge_id = good;
  huge_id["model"]["vocab"]["zz"] = 2000000000;
  expect_load_error(load("huge_id.json", huge_id.dump()), {"huge_id.json", "zz", "2000000000"});
  json huge_added_id = good;
  huge_added_id["added_tokens"] = json::array({{{"id", 1 << 30}, {"content", "<|x|>"}, {"special", true}}});
  expect_load_error(load("huge_added_id.json", huge_added_id.dump()), {"huge_added_id.json", "<|x|>", "1073741824"});
  json normalizer_type = good;
  normalizer_type["normalizer"] = {{"type", 5}};
  expect_load_error(load("normalizer_type.json", normalizer_type.dump()), {"normalizer_type.json", "normalizer"});
  json missing_byte = good;
  missing_byte["model"]["vocab"].erase("a");
  missing_byte["model"]["merges"] = json::array();
  expect_load_error(load("missing_byte.json", missing_byte.dump()), {"missing_byte.json", "0x61"});
  json wordpiece = good;
  wordpiece["model"]["type"] = "WordPiece";
  expect_load_error(load("wordpiece.json", wordpiece.dump()), {"wordpiece.json", "model.type"});
  json bad_split = good;
  bad_split["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "([a-";
  expect_load_error(load("bad_split.json", bad_split.dump()), {"bad_split.json", "pretokenizers[0]"});
  json removed = good;
  removed["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(load("removed.json", removed.dump()), {"removed.json", "behavior"});
  json bad_added = good;
  bad_added["added_tokens"] = json::array({{{"content", "<x>"}}});
  expect_load_error(load("bad_added.json", bad_added.dump()), {"bad_added.json", "added_tokens[0]", "\"id\""});
}

// ---------------------------------------------------------------------------------------------------------------
// tiktoken rank files

std::string base64(std::string_view bytes) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t chunk = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) chunk |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) chunk |= static_cast<unsigned char>(bytes[i + 2]);
    out += alphabet[(chunk >> 18) & 63];
    out += alphabet[(chunk >> 12) & 63];
    out += i + 1 < bytes.size() ? alphabet[(chunk >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? alphabet[chunk & 63] : '=';
  }
  return out;
}

TEST(Tiktoken, MatchesNaiveRankMergingOnRandomText) {
  std::mt19937 rng(11);
  const std::string alphabet = "abc d'\nX9";
  const RandomBpe bpe = random_bpe(rng, alphabet, 400);
  // Shuffle the byte ranks so that rank order is not byte order.
  std::vector<std::string> ranked = bpe.tokens;
  std::shuffle(ranked.begin(), ranked.begin() + 256, rng);
  std::string file;
  std::map<std::string, uint64_t> rank_of;
  for (std::size_t rank = 0; rank < ranked.size(); ++rank) {
    file += base64(ranked[rank]) + " " + std::to_string(rank) + "\n";
    rank_of[ranked[rank]] = rank;
  }
  const auto tokenizer = Tokenizer::from_tiktoken(write_file("random.tiktoken", file), "o200k_base");
  const auto reference_splitter = text::make_regex_pretokenizer(text::kO200kPattern, "test");
  for (int trial = 0; trial < 5000; ++trial) {
    const std::string input = random_text(rng, alphabet, 40);
    std::vector<TokenId> expected;
    for (const std::string& piece : split(*reference_splitter, input)) {
      if (rank_of.count(piece)) {
        expected.push_back(static_cast<TokenId>(rank_of[piece]));
        continue;
      }
      const auto parts = naive_merge(piece, [&](const std::string& a, const std::string& b) -> std::optional<uint64_t> {
        const auto it = rank_of.find(a + b);
        return it == rank_of.end() ? std::nullopt : std::optional<uint64_t>(it->second);
      });
      for (const std::string& part : parts) expected.push_back(static_cast<TokenId>(rank_of.at(part)));
    }
    ASSERT_EQ(tokenizer->encode(input), expected) << "input \"" << input << "\"";
  }
}

TEST(Tiktoken, HarmonySpecialTokens) {
  std::string file;
  for (int b = 0; b < 256; ++b) file += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  const fs::path path = write_file("bytes.tiktoken", file);
  const auto harmony = Tokenizer::from_tiktoken(path, "o200k_harmony");
  EXPECT_EQ(harmony->vocab_size(), 201088u);
  const std::map<std::string, TokenId> expected = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999}, {"<|return|>", 200002}, {"<|constrain|>", 200003},
      {"<|channel|>", 200005},     {"<|start|>", 200006},     {"<|end|>", 200007},    {"<|message|>", 200008},
      {"<|call|>", 200012},        {"<|reserved_200000|>", 200000}, {"<|reserved_201087|>", 201087},
      {"<|endofprompt|>", 200018}, {"<|reserved_200018|>", 200018}};
  for (const auto& [text, id] : expected) {
    EXPECT_EQ(harmony->token_to_id(text), id) << text;
    EXPECT_TRUE(harmony->is_special(id)) << text;
    EXPECT_EQ(harmony->encode(text, true), std::vector<TokenId>{id});
    EXPECT_GT(harmony->encode(text, false).size(), 1u);
  }
  EXPECT_EQ(harmony->token_bytes(200018), "<|endofprompt|>");
  EXPECT_EQ(harmony->decode({200006, 'h', 'i', 200007}), "<|start|>hi<|end|>");
  EXPECT_FALSE(harmony->token_to_id("<|reserved_201088|>").has_value());
  EXPECT_THROW(harmony->decode({201088}), Error);
  EXPECT_THROW(harmony->decode({300}), Error);  // a hole below the specials

  const auto base = Tokenizer::from_tiktoken(path, "o200k_base");
  EXPECT_EQ(base->vocab_size(), 200019u);
  EXPECT_EQ(base->encode("<|endoftext|>", true), std::vector<TokenId>{199999});
  EXPECT_FALSE(base->token_to_id("<|start|>").has_value());
}

TEST(Tiktoken, BrokenFilesNameFileAndLine) {
  std::string good;
  for (int b = 0; b < 256; ++b) good += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  const auto load = [](const std::string& name, const std::string& contents) {
    return [name, contents] { Tokenizer::from_tiktoken(write_file(name, contents), "o200k_base"); };
  };
  expect_load_error(load("bad_base64.tiktoken", good + "!!!! 256\n"), {"bad_base64.tiktoken:257", "base64"});
  expect_load_error(load("bad_rank.tiktoken", good + "YWI= x1\n"), {"bad_rank.tiktoken:257", "rank"});
  expect_load_error(load("no_space.tiktoken", "YWI=\n" + good), {"no_space.tiktoken:1"});
  expect_load_error(load("duplicate.tiktoken", good + "YQ== 256\n"), {"duplicate.tiktoken", "twice"});
  expect_load_error(load("missing_byte.tiktoken", good.substr(good.find('\n') + 1)), {"missing_byte.tiktoken", "0x00"});
  expect_load_error(load("empty.tiktoken", ""), {"empty.tiktoken"});
  expect_load_error([] { Tokenizer::from_tiktoken("/nonexistent/x.tiktoken", "o200k_base"); }, {"/nonexistent/x.tiktoken"});
  expect_load_error([&] { Tokenizer::from_tiktoken(write_file("ok.tiktoken", good), "cl100k_base"); }, {"cl100k_base"});
}

// ---------------------------------------------------------------------------------------------------------------
// Streaming detokenization

std::unique_ptr<Tokenizer> byte_tokenizer() {
  std::string file;
  for (int b = 0; b < 256; ++b) file += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  file += base64("\xF0\x9F") + " 256\n" + base64("\x98\x80!") + " 257\n";
  return Tokenizer::from_tiktoken(write_file("stream.tiktoken", file), "o200k_harmony");
}

TEST(IncrementalDetokenizer, HoldsBackSplitCharacters) {
  const auto tokenizer = byte_tokenizer();
  // é (2 bytes), 中 (3 bytes), 😀 (4 bytes), one byte per token.
  for (const std::string character : {"\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80"}) {
    IncrementalDetokenizer detokenizer(*tokenizer);
    for (std::size_t i = 0; i + 1 < character.size(); ++i) {
      EXPECT_EQ(detokenizer.push(static_cast<unsigned char>(character[i])), "") << i;
    }
    EXPECT_EQ(detokenizer.push(static_cast<unsigned char>(character.back())), character);
    EXPECT_EQ(detokenizer.flush(), "");
  }
  // A token that ends in the middle of the emoji and one that finishes it and goes on.
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.push('a'), "a");
  EXPECT_EQ(detokenizer.push(256), "");
  EXPECT_EQ(detokenizer.push(257), "\xF0\x9F\x98\x80!");
  // Specials come out as their text.
  EXPECT_EQ(detokenizer.push(200007), "<|end|>");
}

TEST(IncrementalDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  const auto tokenizer = byte_tokenizer();
  const std::string replacement = "\xEF\xBF\xBD";
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.push(0x80), replacement);          // a lone continuation byte
  EXPECT_EQ(detokenizer.push(0xE4), "");                   // could still become 中
  EXPECT_EQ(detokenizer.push('x'), replacement + "x");     // it did not
  EXPECT_EQ(detokenizer.push(0xE0), "");
  EXPECT_EQ(detokenizer.push(0x80), replacement + replacement);  // E0 80 can never be valid
  EXPECT_EQ(detokenizer.push(0xF0), "");
  EXPECT_EQ(detokenizer.flush(), replacement);             // cut short at the end
}

TEST(IncrementalDetokenizer, PiecesConcatenateToDecodeAndAreWholeCharacters) {
  const auto tokenizer = byte_tokenizer();
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string bytes = trial % 2 ? random_bytes(rng, 24) : random_unicode(rng, 12);
    std::vector<TokenId> ids;
    for (const char c : bytes) ids.push_back(static_cast<unsigned char>(c));
    IncrementalDetokenizer detokenizer(*tokenizer);
    std::string streamed;
    for (const TokenId id : ids) {
      const std::string piece = detokenizer.push(id);
      ASSERT_TRUE(text::is_valid_utf8(piece));
      streamed += piece;
    }
    const std::string rest = detokenizer.flush();
    ASSERT_TRUE(text::is_valid_utf8(rest));
    ASSERT_EQ(streamed + rest, tokenizer->decode(ids));
  }
}

TEST(Utf8, LossyReplacementFollowsMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(text::replace_invalid_utf8("a\xE2\x82" "b"), "a" + r + "b");  // one U+FFFD for a truncated sequence
  EXPECT_EQ(text::replace_invalid_utf8("\xE0\x80"), r + r);
  EXPECT_EQ(text::replace_invalid_utf8("\xED\xA0\x80"), r + r + r);  // surrogates are invalid
  EXPECT_EQ(text::replace_invalid_utf8("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(text::replace_invalid_utf8("\xC0\xAF"), r + r);
  EXPECT_EQ(text::replace_invalid_utf8("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace beamline
