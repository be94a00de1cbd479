// Streaming Harmony parser: round trips of random conversations through the renderer, event streams that
// rebuild the same messages, header variants, strict-mode errors, lenient recovery, and multi-byte
// characters split across tokens.
#include <gtest/gtest.h>

#include <random>

#include "harmony/harmony_parser.h"
#include "harmony/harmony_render.h"
#include "harmony_fake_tokenizer.h"
#include "harmony_test_support.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beamline::harmony {
namespace {

using testing::ByteTokenizer;
using testing::unordered;

// Text drawn from ASCII, Latin-1, CJK, emoji, whitespace and Harmony's special-token strings (which a
// user may type and which must stay text).
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> atoms = {"a", "Z", " ", "\n", "  ", "7", "{\"k\": 1}", "é", "ß", "中", "文",
                                                 "😀", "👩‍💻", "ﬁ", "<|end|>", "<|start|>", "<|message|>", "<", "|",
                                                 "to=x", "\t"};
  std::uniform_int_distribution<int> length(0, 40);
  std::uniform_int_distribution<std::size_t> pick(0, atoms.size() - 1);
  std::string text;
  for (int i = length(rng); i > 0; --i) text += atoms[pick(rng)];
  return text;
}

Message random_message(std::mt19937& rng) {
  static const std::vector<std::string> channels = {"analysis", "commentary", "final"};
  static const std::vector<std::string> recipients = {"functions.get_weather", "browser.search", "python", "assistant"};
  static const std::vector<std::string> content_types = {"json", "<|constrain|>json", "code"};
  std::uniform_int_distribution<int> coin(0, 1);
  std::uniform_int_distribution<int> role_pick(0, 3);
  Message message = Message::text(Role::User, random_text(rng));
  switch (role_pick(rng)) {
    case 0: message.role = Role::User; if (coin(rng)) message.name = "alice"; break;
    case 1: message.role = Role::Developer; break;
    case 2: message.role = Role::Assistant; break;
    default: message.role = Role::Tool; message.name = recipients[static_cast<std::size_t>(role_pick(rng)) % 3]; break;
  }
  if (message.role == Role::Assistant || message.role == Role::Tool || coin(rng)) {
    message.channel = channels[std::uniform_int_distribution<std::size_t>(0, 2)(rng)];
  }
  if (message.role != Role::User && coin(rng)) {
    message.recipient = message.role == Role::Tool ? "assistant" : recipients[static_cast<std::size_t>(role_pick(rng)) % 3];
  }
  if (coin(rng)) message.content_type = content_types[std::uniform_int_distribution<std::size_t>(0, 2)(rng)];
  return message;
}

Conversation random_conversation(std::mt19937& rng) {
  Conversation conversation;
  for (int i = std::uniform_int_distribution<int>(1, 8)(rng); i > 0; --i) {
    conversation.messages.push_back(random_message(rng));
  }
  return conversation;
}

std::vector<TokenId> render_ids(const Conversation& conversation, const Tokenizer& tokenizer) {
  RenderOptions options;
  options.auto_drop_analysis = false;
  return pieces_to_ids(render_conversation(conversation, options), tokenizer);
}

// Messages rebuilt from nothing but the event stream.
std::vector<Message> messages_from_events(const std::vector<ParseEvent>& events) {
  std::vector<Message> messages;
  for (const ParseEvent& event : events) {
    switch (event.kind) {
      case ParseEvent::Kind::MessageStart: {
        Message message = Message::text(event.header.role, "");
        message.name = event.header.name;
        message.channel = event.header.channel;
        message.recipient = event.header.recipient;
        message.content_type = event.header.content_type;
        messages.push_back(std::move(message));
        break;
      }
      case ParseEvent::Kind::ContentDelta:
        std::get<TextContent>(messages.back().content.front()).text += event.text;
        break;
      case ParseEvent::Kind::MessageEnd: break;
    }
  }
  return messages;
}

TEST(HarmonyParser, RandomConversationsRoundTripThroughTheRenderer) {
  const ByteTokenizer tokenizer;
  for (unsigned seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(seed);
    const Conversation conversation = random_conversation(rng);
    const auto parsed = parse_completion(tokenizer, render_ids(conversation, tokenizer), ParserOptions{});
    ASSERT_EQ(unordered(to_json(parsed)), unordered(to_json(conversation.messages))) << "seed " << seed;
  }
}

TEST(HarmonyParser, RoundTripWithO200kHarmony) {
  const Tokenizer* tokenizer = testing::o200k_harmony();
  if (tokenizer == nullptr) GTEST_SKIP() << "no o200k rank data at " << testing::o200k_ranks_path();
  for (unsigned seed = 0; seed < 100; ++seed) {
    std::mt19937 rng(seed);
    const Conversation conversation = random_conversation(rng);
    const auto parsed = parse_completion(*tokenizer, render_ids(conversation, *tokenizer), ParserOptions{});
    ASSERT_EQ(unordered(to_json(parsed)), unordered(to_json(conversation.messages))) << "seed " << seed;
  }
}

// Events collected token by token, in random batches, rebuild the same messages as the whole-sequence
// parse, and every content delta is complete UTF-8 although each non-ASCII character spans tokens.
TEST(HarmonyParser, StreamingEventsRebuildTheMessagesWithWholeCharacters) {
  const ByteTokenizer tokenizer;
  for (unsigned seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(seed);
    const Conversation conversation = random_conversation(rng);
    const std::vector<TokenId> ids = render_ids(conversation, tokenizer);
    StreamingParser parser(tokenizer, ParserOptions{});
    std::vector<ParseEvent> events;
    std::size_t next = 0;
    while (next < ids.size()) {
      const std::size_t batch = std::uniform_int_distribution<std::size_t>(1, 7)(rng);
      for (std::size_t i = 0; i < batch && next < ids.size(); ++i, ++next) {
        for (ParseEvent& event : parser.push(ids[next])) events.push_back(std::move(event));
      }
    }
    for (ParseEvent& event : parser.finish()) events.push_back(std::move(event));
    for (const ParseEvent& event : events) {
      if (event.kind == ParseEvent::Kind::ContentDelta) {
        ASSERT_FALSE(event.text.empty());
        ASSERT_TRUE(text::is_valid_utf8(event.text)) << "seed " << seed;
      }
    }
    ASSERT_EQ(unordered(to_json(messages_from_events(events))), unordered(to_json(conversation.messages)))
        << "seed " << seed;
    ASSERT_EQ(unordered(to_json(parser.messages())), unordered(to_json(conversation.messages))) << "seed " << seed;
  }
}

TEST(HarmonyParser, CharacterSplitAcrossTokensArrivesWhole) {
  const ByteTokenizer tokenizer;
  const std::string text = "中😀é";
  std::vector<TokenId> ids = tokenizer.encode("<|channel|>final<|message|>", true);
  const std::vector<TokenId> content = tokenizer.encode(text, false);
  ids.insert(ids.end(), content.begin(), content.end());
  StreamingParser parser(tokenizer, ParserOptions{Role::Assistant});
  std::vector<std::string> deltas;
  for (TokenId id : ids) {
    for (const ParseEvent& event : parser.push(id)) {
      if (event.kind == ParseEvent::Kind::ContentDelta) deltas.push_back(event.text);
    }
  }
  EXPECT_EQ(deltas, (std::vector<std::string>{"中", "😀", "é"}));
  const auto end = parser.finish();
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].kind, ParseEvent::Kind::MessageEnd);
  EXPECT_FALSE(end[0].terminator.has_value());
}

TEST(HarmonyParser, TruncatedCharacterAtEndOfInputBecomesReplacement) {
  const ByteTokenizer tokenizer;
  std::vector<TokenId> ids = tokenizer.encode("<|channel|>final<|message|>ok", true);
  ids.push_back(0xE4);  // first byte of a three-byte character, then the input stops
  const auto messages = parse_completion(tokenizer, ids, ParserOptions{Role::Assistant});
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].text_content(), "ok\xEF\xBF\xBD");
}

struct HeaderCase {
  std::string header;
  std::optional<Role> known_role;
  MessageHeader expected;
};

TEST(HarmonyParser, HeaderVariants) {
  const auto tool_call = [](std::optional<std::string> content_type) {
    return MessageHeader{Role::Assistant, std::nullopt, "commentary", "functions.f", std::move(content_type)};
  };
  const std::vector<HeaderCase> cases = {
      {"assistant to=functions.f<|channel|>commentary <|constrain|>json", std::nullopt, tool_call("<|constrain|>json")},
      {"assistant to=functions.f<|channel|>commentary<|constrain|>json", std::nullopt, tool_call("<|constrain|>json")},
      {"assistant<|channel|>commentary to=functions.f <|constrain|>json", std::nullopt, tool_call("<|constrain|>json")},
      {"assistant<|channel|>commentary to=functions.f<|constrain|>json", std::nullopt, tool_call("<|constrain|>json")},
      {"assistant<|channel|>commentary to=functions.f json", std::nullopt, tool_call("json")},
      {" to=functions.f<|channel|>commentary json", Role::Assistant, tool_call("json")},
      {"<|channel|>commentary to=functions.f", Role::Assistant, tool_call(std::nullopt)},
      {"assistant<|channel|>commentary to=functions.f", Role::Assistant, tool_call(std::nullopt)},
      {"<|channel|>final", Role::Assistant, MessageHeader{Role::Assistant, std::nullopt, "final"}},
      {"user", std::nullopt, MessageHeader{Role::User}},
      {"user:alice", std::nullopt, MessageHeader{Role::User, "alice"}},
      {"functions.get_weather", std::nullopt, MessageHeader{Role::Tool, "functions.get_weather"}},
      {"functions.get_weather to=assistant<|channel|>commentary", std::nullopt,
       MessageHeader{Role::Tool, "functions.get_weather", "commentary", "assistant"}},
  };
  for (const HeaderCase& test : cases) {
    EXPECT_EQ(parse_header(test.header, test.known_role, true, {"analysis", "commentary", "final"}), test.expected)
        << test.header;
  }
}

struct MalformedCase {
  std::string text;  // Harmony text, special tokens written literally
  std::optional<Role> role;
  std::string error;  // part of the strict-mode message
};

TEST(HarmonyParser, StrictModeReportsMalformedOutput) {
  const ByteTokenizer tokenizer;
  const std::vector<MalformedCase> cases = {
      {"hello<|start|>assistant<|message|>x<|end|>", std::nullopt, "expected <|start|>"},
      {"<|channel|>final<|end|>", Role::Assistant, "header ends before <|message|>"},
      {"<|channel|>final<|message|>a<|start|>assistant<|message|>b", Role::Assistant, "before the current one was terminated"},
      {"<|channel|>final<|message|>a<|channel|>b", Role::Assistant, "special token in message content"},
      {"<|channel|>final<|endoftext|><|message|>a", Role::Assistant, "special token in a message header"},
      {"<|channel|>thinking<|message|>a", Role::Assistant, "not one of the valid channels"},
      {"<|channel|><|message|>a", Role::Assistant, "not followed by a channel name"},
      {"<|channel|>final json extra<|message|>a", Role::Assistant, "unexpected words"},
      {"<|start|> to=x<|message|>a", std::nullopt, "does not start with a role"},
      {"<|channel|>commentary to=a to=b<|message|>a", Role::Assistant, "two recipients"},
      {"<|channel|>final", Role::Assistant, "ends inside a message header"},
  };
  for (const MalformedCase& test : cases) {
    ParserOptions options{test.role, true, {"analysis", "commentary", "final"}};
    try {
      parse_completion(tokenizer, tokenizer.encode(test.text, true), options);
      ADD_FAILURE() << "no error for " << test.text;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(test.error), std::string::npos) << test.text << " -> " << error.what();
      EXPECT_NE(std::string(error.what()).find("token"), std::string::npos) << error.what();
    }
    options.strict = false;
    EXPECT_NO_THROW(parse_completion(tokenizer, tokenizer.encode(test.text, true), options)) << test.text;
  }
}

TEST(HarmonyParser, ErrorNamesTheTokenPosition) {
  const ByteTokenizer tokenizer;
  try {
    parse_completion(tokenizer, tokenizer.encode("<|channel|>final<|end|>", true), ParserOptions{Role::Assistant});
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("at token 6"), std::string::npos) << error.what();
  }
}

TEST(HarmonyParser, LenientModeRecovers) {
  const ByteTokenizer tokenizer;
  const ParserOptions lenient{Role::Assistant, false, {}};
  // A message cut off by the next <|start|> still counts; stray text and specials are skipped.
  const auto messages = parse_completion(
      tokenizer,
      tokenizer.encode("<|channel|>analysis<|message|>think<|channel|>ing<|start|>assistant<|channel|>final<|message|>"
                       "answer<|return|>junk<|start|>assistant<|channel|>final<|message|>more",
                       true),
      lenient);
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0].channel, "analysis");
  EXPECT_EQ(messages[0].text_content(), "thinking");
  EXPECT_EQ(messages[1].channel, "final");
  EXPECT_EQ(messages[1].text_content(), "answer");
  EXPECT_EQ(messages[2].text_content(), "more");
}

TEST(HarmonyParser, TerminatorsAreReported) {
  const ByteTokenizer tokenizer;
  for (const auto& [token, terminator] : {std::pair{"<|end|>", Terminator::End}, std::pair{"<|call|>", Terminator::Call},
                                          std::pair{"<|return|>", Terminator::Return}}) {
    StreamingParser parser(tokenizer, ParserOptions{Role::Assistant});
    std::optional<Terminator> seen;
    for (TokenId id : tokenizer.encode(std::string("<|channel|>final<|message|>x") + token, true)) {
      for (const ParseEvent& event : parser.push(id)) {
        if (event.kind == ParseEvent::Kind::MessageEnd) seen = event.terminator;
      }
    }
    EXPECT_EQ(seen, terminator);
    EXPECT_EQ(parser.last_terminator(), terminator);
    EXPECT_EQ(terminator_token(terminator), token);
  }
}

TEST(HarmonyParser, MissingSpecialTokenIsAnError) {
  class NoSpecials final : public Tokenizer {
   public:
    std::vector<TokenId> encode(std::string_view, bool) const override { return {}; }
    std::string decode_bytes(const std::vector<TokenId>&) const override { return {}; }
    std::string_view token_bytes(TokenId) const override { return {}; }
    std::optional<TokenId> token_to_id(std::string_view) const override { return std::nullopt; }
    bool is_special(TokenId) const override { return false; }
    std::size_t vocab_size() const override { return 0; }
  } tokenizer;
  EXPECT_THROW(StreamingParser(tokenizer, ParserOptions{}), Error);
}

}  // namespace
}  // namespace beamline::harmony
