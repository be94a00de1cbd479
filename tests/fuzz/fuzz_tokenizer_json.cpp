// Fuzzes tokenizer.json loading (tokenizer/tokenizer_json): the input is the file. A tokenizer it accepts then
// encodes a text (with and without special tokens) and decodes the ids back, so a table that loaded but is
// inconsistent (ids past the vocabulary, merges of unknown tokens) shows up here rather than in a request.
#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const auto path = beamline::fuzz::write_input_file(data, size, "tokenizer.json");
  std::unique_ptr<beamline::Tokenizer> tokenizer;
  try {
    tokenizer = beamline::Tokenizer::from_tokenizer_json(path);
  } catch (const beamline::Error&) {
    return 0;
  }
  for (const bool allow_special : {false, true}) {
    const std::string_view text = "Hello, world! 123 <|endoftext|> naïve 日本";
    try {
      const std::vector<beamline::TokenId> ids = tokenizer->encode(text, allow_special);
      (void)tokenizer->decode(ids);
    } catch (const beamline::Error&) {
    }
  }
  const std::size_t vocab = tokenizer->vocab_size();
  for (std::size_t id = 0; id < vocab && id < 1024; ++id) {
    try {
      (void)tokenizer->token_bytes(static_cast<beamline::TokenId>(id));
      (void)tokenizer->is_special(static_cast<beamline::TokenId>(id));
    } catch (const beamline::Error&) {  // a hole in the id range
    }
  }
  return 0;
}
