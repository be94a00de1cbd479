#include "harmony/harmony_parser.h"

#include <algorithm>

#include "util/error.h"

namespace beamline::harmony {

namespace {

constexpr std::string_view kChannelMarker = "<|channel|>";
constexpr std::string_view kConstrainMarker = "<|constrain|>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    const std::size_t begin = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > begin) words.emplace_back(text.substr(begin, i - begin));
  }
  return words;
}

// `<|constrain|>` written straight after the channel or recipient becomes its own word.
std::string separate_constrain(const std::string& header) {
  std::string out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t found = header.find(kConstrainMarker, begin);
    out += header.substr(begin, found == std::string::npos ? std::string::npos : found - begin);
    if (found == std::string::npos) break;
    if (!out.empty() && !is_space(out.back())) out += ' ';
    out += kConstrainMarker;
    begin = found + kConstrainMarker.size();
  }
  return out;
}

// "user" or "user:alice" for a known role; nullopt otherwise.
std::optional<std::pair<Role, std::optional<std::string>>> role_word(const std::string& word) {
  const std::size_t colon = word.find(':');
  auto role = role_from_name(word.substr(0, colon));
  if (!role) return std::nullopt;
  std::optional<std::string> name;
  if (colon != std::string::npos) name = word.substr(colon + 1);
  return std::pair{*role, name};
}

std::string join_words(const std::vector<std::string>& words) {
  std::string joined;
  for (const std::string& word : words) joined += (joined.empty() ? "" : " ") + word;
  return joined;
}

}  // namespace

std::string_view terminator_token(Terminator terminator) {
  switch (terminator) {
    case Terminator::End: return "<|end|>";
    case Terminator::Call: return "<|call|>";
    case Terminator::Return: return "<|return|>";
  }
  fail("invalid terminator value {}", static_cast<int>(terminator));
}

MessageHeader parse_header(const std::string& header_text, std::optional<Role> known_role, bool strict,
                           const std::vector<std::string>& valid_channels) {
  MessageHeader header;
  std::string rest = separate_constrain(header_text);
  if (const std::size_t marker = rest.find(kChannelMarker); marker != std::string::npos) {
    const std::size_t value_begin = marker + kChannelMarker.size();
    std::size_t value_end = value_begin;
    while (value_end < rest.size() && !is_space(rest[value_end]) && rest[value_end] != '<') ++value_end;
    const std::string channel = rest.substr(value_begin, value_end - value_begin);
    if (channel.empty()) {
      require(!strict, "<|channel|> is not followed by a channel name in header '{}'", header_text);
    } else {
      header.channel = channel;
    }
    rest = rest.substr(0, marker) + " " + rest.substr(value_end);
    require(!strict || rest.find(kChannelMarker) == std::string::npos, "header '{}' has more than one <|channel|>",
            header_text);
  }
  std::vector<std::string> words = split_words(rest);

  if (known_role) {
    header.role = *known_role;
    // Tolerate the model repeating the role the prompt already gave.
    if (!words.empty()) {
      auto repeated = role_word(words.front());
      if (repeated && repeated->first == *known_role) {
        header.name = repeated->second;
        words.erase(words.begin());
      }
    }
  } else if (words.empty() || words.front().starts_with("to=") || words.front().starts_with(kConstrainMarker)) {
    require(!strict, "header '{}' does not start with a role or a tool name", header_text);
    header.role = Role::Assistant;
  } else {
    if (auto role = role_word(words.front())) {
      header.role = role->first;
      header.name = role->second;
    } else {
      header.role = Role::Tool;
      header.name = words.front();
    }
    words.erase(words.begin());
  }

  std::vector<std::string> others;
  for (std::string& word : words) {
    if (!word.starts_with("to=")) {
      others.push_back(std::move(word));
      continue;
    }
    const std::string recipient = word.substr(3);
    if (recipient.empty()) {
      require(!strict, "empty recipient 'to=' in header '{}'", header_text);
    } else if (header.recipient) {
      require(!strict, "header '{}' names two recipients", header_text);
    } else {
      header.recipient = recipient;
    }
  }
  if (!others.empty()) {
    require(!strict || others.size() == 1, "header '{}' has unexpected words '{}' (only one content type is allowed)",
            header_text, join_words(others));
    header.content_type = others.back();
  }
  if (strict && header.channel && !valid_channels.empty()) {
    require(std::find(valid_channels.begin(), valid_channels.end(), *header.channel) != valid_channels.end(),
            "channel '{}' in header '{}' is not one of the valid channels ({})", *header.channel, header_text,
            join_words(valid_channels));
  }
  return header;
}

StreamingParser::StreamingParser(const Tokenizer& tokenizer, ParserOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  auto special = [&](std::string_view token) {
    auto id = tokenizer_.token_to_id(token);
    require(id.has_value(), "the tokenizer has no special token {} (Harmony needs the o200k_harmony specials)", token);
    return *id;
  };
  start_ = special("<|start|>");
  message_ = special("<|message|>");
  channel_ = special(kChannelMarker);
  constrain_ = special(kConstrainMarker);
  end_ = special("<|end|>");
  call_ = special("<|call|>");
  return_ = special("<|return|>");
  state_ = options_.role ? State::Header : State::ExpectStart;
  header_role_ = options_.role;
}

void StreamingParser::malformed(TokenId id, const std::string& what) const {
  fail("malformed Harmony output at token {} ({}): {}", position_, describe(id), what);
}

std::string StreamingParser::describe(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= tokenizer_.vocab_size()) return fmt::format("id {}", id);
  return fmt::format("id {} '{}'", id, tokenizer_.decode({id}));
}

std::optional<Terminator> StreamingParser::terminator_of(TokenId id) const {
  if (id == end_) return Terminator::End;
  if (id == call_) return Terminator::Call;
  if (id == return_) return Terminator::Return;
  return std::nullopt;
}

std::vector<ParseEvent> StreamingParser::push(TokenId id) {
  std::vector<ParseEvent> events;
  switch (state_) {
    case State::ExpectStart:
      if (id == start_) {
        state_ = State::Header;
        header_role_.reset();
        header_ids_.clear();
      } else if (options_.strict) {
        malformed(id, "expected <|start|> to begin the next message");
      }
      break;
    case State::Header: push_header(id, events); break;
    case State::Content: push_content(id, events); break;
  }
  ++position_;
  return events;
}

void StreamingParser::push_header(TokenId id, std::vector<ParseEvent>& events) {
  if (id == message_) {
    start_content(id, events);
  } else if (id == start_) {
    if (options_.strict) malformed(id, "a new message starts inside a message header");
    header_role_.reset();
    header_ids_.clear();
  } else if (terminator_of(id)) {
    if (options_.strict) malformed(id, "the message header ends before <|message|>");
    header_ids_.clear();
    state_ = State::ExpectStart;
  } else if (id == channel_ || id == constrain_ || !tokenizer_.is_special(id)) {
    header_ids_.push_back(id);
  } else if (options_.strict) {
    malformed(id, "unexpected special token in a message header");
  }
}

void StreamingParser::start_content(TokenId message_token, std::vector<ParseEvent>& events) {
  std::string text;
  std::vector<TokenId> run;
  auto flush_run = [&] {
    if (run.empty()) return;
    std::string decoded = tokenizer_.decode(run);
    if (options_.strict && decoded != tokenizer_.decode_bytes(run)) malformed(message_token, "the message header is not valid UTF-8");
    text += decoded;
    run.clear();
  };
  for (TokenId id : header_ids_) {
    if (id == channel_ || id == constrain_) {
      flush_run();
      text += id == channel_ ? kChannelMarker : kConstrainMarker;
    } else {
      run.push_back(id);
    }
  }
  flush_run();
  try {
    header_ = parse_header(text, header_role_, options_.strict, options_.valid_channels);
  } catch (const Error& error) {
    malformed(message_token, error.what());
  }
  header_ids_.clear();
  current_.emplace();
  current_->role = header_->role;
  current_->name = header_->name;
  current_->channel = header_->channel;
  current_->recipient = header_->recipient;
  current_->content_type = header_->content_type;
  current_->content.emplace_back(TextContent{});
  detokenizer_.emplace(tokenizer_);
  state_ = State::Content;
  events.push_back(ParseEvent{ParseEvent::Kind::MessageStart, *header_, {}, std::nullopt});
}

void StreamingParser::push_content(TokenId id, std::vector<ParseEvent>& events) {
  if (auto terminator = terminator_of(id)) {
    end_message(terminator, events);
    state_ = State::ExpectStart;
    return;
  }
  if (id == start_) {
    if (options_.strict) malformed(id, "a new message starts before the current one was terminated");
    end_message(std::nullopt, events);
    state_ = State::Header;
    header_role_.reset();
    return;
  }
  if (tokenizer_.is_special(id)) {
    if (options_.strict) malformed(id, "unexpected special token in message content");
    return;
  }
  std::string text = detokenizer_->push(id);
  if (text.empty()) return;
  std::get<TextContent>(current_->content.front()).text += text;
  events.push_back(ParseEvent{ParseEvent::Kind::ContentDelta, *header_, std::move(text), std::nullopt});
}

void StreamingParser::end_message(std::optional<Terminator> terminator, std::vector<ParseEvent>& events) {
  std::string rest = detokenizer_->flush();
  if (!rest.empty()) {
    std::get<TextContent>(current_->content.front()).text += rest;
    events.push_back(ParseEvent{ParseEvent::Kind::ContentDelta, *header_, std::move(rest), std::nullopt});
  }
  events.push_back(ParseEvent{ParseEvent::Kind::MessageEnd, *header_, {}, terminator});
  messages_.push_back(std::move(*current_));
  current_.reset();
  detokenizer_.reset();
  last_terminator_ = terminator;
}

std::vector<ParseEvent> StreamingParser::finish() {
  std::vector<ParseEvent> events;
  if (state_ == State::Content) {
    end_message(std::nullopt, events);
    state_ = State::ExpectStart;
  } else if (state_ == State::Header && !header_ids_.empty()) {
    if (options_.strict) {
      fail("malformed Harmony output: the input ends inside a message header, after token {}", position_);
    }
    header_ids_.clear();
    state_ = State::ExpectStart;
  }
  return events;
}

std::vector<Message> parse_completion(const Tokenizer& tokenizer, const std::vector<TokenId>& ids,
                                      const ParserOptions& options) {
  StreamingParser parser(tokenizer, options);
  for (TokenId id : ids) parser.push(id);
  parser.finish();
  return parser.messages();
}

}  // namespace beamline::harmony
