// Fuzzes the streaming Harmony parser (harmony/harmony_parser) on random token streams, over the byte-level test
// tokenizer (ids 0-255 are bytes, so every multi-byte character and every header arrives split across tokens).
// The first input byte picks the options (strict or lenient, whether the prompt already gave the role, whether
// channels are checked); after it each byte is a byte token, except 0xFF, which makes the next byte a special token.
// Checked: strict mode answers malformed output with beamline::Error; lenient mode (serving) never throws; the
// content deltas of each message add up to that message's text.
#include <cstdlib>

#include "fuzz_support.h"
#include "harmony/harmony_fake_tokenizer.h"
#include "harmony/harmony_parser.h"
#include "util/error.h"

namespace {

using beamline::harmony::ParseEvent;
using beamline::harmony::testing::ByteTokenizer;

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const ByteTokenizer tokenizer;
  beamline::harmony::ParserOptions options;
  options.strict = (data[0] & 1) != 0;
  if ((data[0] & 2) != 0) options.role = beamline::harmony::Role::Assistant;
  if ((data[0] & 4) != 0) options.valid_channels = {"analysis", "commentary", "final"};

  std::vector<beamline::TokenId> ids;
  for (std::size_t i = 1; i < size; ++i) {
    if (data[i] == 0xFF && i + 1 < size) {
      ids.push_back(ByteTokenizer::kFirstSpecial + static_cast<beamline::TokenId>(data[++i] % ByteTokenizer::kSpecials.size()));
    } else {
      ids.push_back(data[i]);
    }
  }

  beamline::harmony::StreamingParser parser(tokenizer, options);
  std::vector<std::string> message_texts;  // the deltas of each message, concatenated
  std::string open_text;
  const auto take = [&](const std::vector<ParseEvent>& events) {
    for (const ParseEvent& event : events) {
      if (event.kind == ParseEvent::Kind::MessageStart) open_text.clear();
      if (event.kind == ParseEvent::Kind::ContentDelta) open_text += event.text;
      if (event.kind == ParseEvent::Kind::MessageEnd) message_texts.push_back(std::move(open_text));
    }
  };
  try {
    for (const beamline::TokenId id : ids) take(parser.push(id));
    take(parser.finish());
  } catch (const beamline::Error&) {
    check(options.strict);
    return 0;
  }
  check(parser.messages().size() == message_texts.size());
  for (std::size_t m = 0; m < message_texts.size(); ++m) check(parser.messages()[m].text_content() == message_texts[m]);
  return 0;
}
