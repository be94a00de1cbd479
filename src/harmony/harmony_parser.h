#pragma once
// Streaming Harmony parser: token ids in, events out (a message starts with its header, content arrives
// as text deltas, the message ends with its terminator). Content deltas come from IncrementalDetokenizer,
// so a multi-byte character is never split between two deltas.
//
// Header variants the model produces are all accepted: the recipient before or after the channel
// (`assistant to=functions.f<|channel|>commentary json` or `assistant<|channel|>commentary to=functions.f json`)
// and `<|constrain|>` with or without a space before it. An unknown first header word is a tool's name
// (the author of a tool result, e.g. `functions.get_weather to=assistant`).
//
// Strict mode (the default) throws beamline::Error naming the token position on malformed output: a token
// outside a message, a header cut short by a terminator, a special token inside content, an unknown channel,
// invalid UTF-8 in a header, stray header words. Lenient mode (for serving) recovers and keeps going.
#include <optional>
#include <string>
#include <vector>

#include "harmony/harmony_message.h"
#include "tokenizer/tokenizer.h"

namespace beamline::harmony {

enum class Terminator { End, Call, Return };
std::string_view terminator_token(Terminator terminator);

struct MessageHeader {
  Role role = Role::Assistant;
  std::optional<std::string> name;
  std::optional<std::string> channel;
  std::optional<std::string> recipient;
  std::optional<std::string> content_type;

  bool operator==(const MessageHeader&) const = default;
};

struct ParseEvent {
  enum class Kind { MessageStart, ContentDelta, MessageEnd };
  Kind kind = Kind::MessageStart;
  MessageHeader header;                  // the message this event belongs to
  std::string text;                      // ContentDelta only
  std::optional<Terminator> terminator;  // MessageEnd only; absent when the input ended first
};

struct ParserOptions {
  // The first message's role when the prompt already ended with `<|start|>{role}` (completion parsing);
  // absent: the input starts with `<|start|>` and every header names its role.
  std::optional<Role> role;
  bool strict = true;
  // Strict mode rejects a channel outside this list; empty accepts any.
  std::vector<std::string> valid_channels;
};

class StreamingParser {
 public:
  StreamingParser(const Tokenizer& tokenizer, ParserOptions options);

  // The events this token completes (often none: header tokens, held-back bytes of a character).
  std::vector<ParseEvent> push(TokenId id);
  // End of input: an unterminated message is flushed and ends without a terminator.
  std::vector<ParseEvent> finish();

  const std::vector<Message>& messages() const { return messages_; }   // completed messages
  const std::optional<Message>& current() const { return current_; }  // the message being read
  // The terminator of the last completed message, if it had one.
  std::optional<Terminator> last_terminator() const { return last_terminator_; }

 private:
  enum class State { ExpectStart, Header, Content };

  [[noreturn]] void malformed(TokenId id, const std::string& what) const;
  std::string describe(TokenId id) const;
  std::optional<Terminator> terminator_of(TokenId id) const;
  void start_content(TokenId message_token, std::vector<ParseEvent>& events);
  void end_message(std::optional<Terminator> terminator, std::vector<ParseEvent>& events);
  void push_header(TokenId id, std::vector<ParseEvent>& events);
  void push_content(TokenId id, std::vector<ParseEvent>& events);

  const Tokenizer& tokenizer_;
  ParserOptions options_;
  TokenId start_, message_, channel_, constrain_, end_, call_, return_;
  State state_;
  std::optional<Role> header_role_;
  std::vector<TokenId> header_ids_;
  std::optional<MessageHeader> header_;
  std::optional<IncrementalDetokenizer> detokenizer_;
  std::optional<Message> current_;
  std::vector<Message> messages_;
  std::optional<Terminator> last_terminator_;
  std::size_t position_ = 0;  // index of the token being pushed, for error messages
};

// Header text between `<|start|>` and `<|message|>`, with `<|channel|>` / `<|constrain|>` written literally.
// `known_role` is the role already given by the prompt. Throws (strict) or recovers (lenient); messages do
// not carry a token position, the parser adds it.
MessageHeader parse_header(const std::string& header, std::optional<Role> known_role, bool strict,
                           const std::vector<std::string>& valid_channels);

// Whole-sequence parse: push every id, then finish.
std::vector<Message> parse_completion(const Tokenizer& tokenizer, const std::vector<TokenId>& ids,
                                      const ParserOptions& options);

}  // namespace beamline::harmony
