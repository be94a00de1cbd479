#include "structured/harmony_constraint.h"

#include <algorithm>

#include "structured/json_schema.h"

namespace beamline {
namespace {

// A tool that takes no arguments is called with an empty object.
constexpr std::string_view kNoArguments = R"({"type": "object", "additionalProperties": false})";

class HarmonyGrammarBuilder {
 public:
  explicit HarmonyGrammarBuilder(const HarmonyConstraintSpec& spec) : spec_(spec) {}

  Grammar build() {
    text_ = g_.add_rule("text");
    g_.set_body(text_, g_.star(g_.bytes(ByteSet::range(0, kHarmonyFirstByte - 1))));
    for (std::size_t i = 0; i < spec_.tools.size(); ++i) {
      const HarmonyTool& tool = spec_.tools[i];
      try {
        args_.push_back(g_.import(json_schema_grammar(tool.parameters.value_or(std::string(kNoArguments))),
                                  "tool" + std::to_string(i) + "."));
      } catch (const UnsupportedGrammar& error) {
        throw UnsupportedGrammar(error.keyword(), "tool '" + tool.recipient + "': " + error.what());
      }
    }
    const RuleId root = g_.add_rule("root");
    g_.set_body(root, root_body());
    g_.set_root(root);
    return std::move(g_);
  }

 private:
  ExprId special(std::string_view token) { return g_.bytes(ByteSet::single(harmony_byte(token))); }

  // ` <|constrain|>json` and the other forms the official parser reads; none at all is allowed too.
  ExprId content_type() {
    return g_.optional(g_.choice({g_.sequence({g_.optional(g_.literal(" ")), special("<|constrain|>"), g_.literal("json")}),
                                  g_.literal(" json"), g_.literal(" code")}));
  }

  bool builtin(const HarmonyTool& tool) const { return !tool.recipient.starts_with(spec_.tool_namespace + "."); }

  // From the content type on: ... <|message|> args <|call|>.
  ExprId call_tail(std::size_t tool) {
    return g_.sequence({content_type(), special("<|message|>"), g_.rule_ref(args_[tool]), special("<|call|>")});
  }

  ExprId call(std::size_t tool) {
    const HarmonyTool& t = spec_.tools[tool];
    std::vector<ExprId> channels{g_.literal(spec_.tool_channel)};
    if (builtin(t) && spec_.reasoning_channel != spec_.tool_channel) channels.push_back(g_.literal(spec_.reasoning_channel));
    const ExprId channel = g_.choice(channels);
    const ExprId recipient = g_.literal(" to=" + t.recipient);
    const ExprId header = g_.choice({g_.sequence({recipient, special("<|channel|>"), channel}),
                                     g_.sequence({special("<|channel|>"), channel, recipient})});
    return g_.sequence({header, call_tail(tool)});
  }

  ExprId text_message(const std::string& channel, std::string_view terminator, ExprId content) {
    return g_.sequence({special("<|channel|>"), g_.literal(channel), special("<|message|>"), content, special(terminator)});
  }

  ExprId root_body() {
    using Start = HarmonyConstraintSpec::Start;
    require(spec_.start == Start::kTurn || !spec_.tools.empty(), "harmony constraint: a forced tool call needs tools");
    require(!spec_.require_tool_call || !spec_.tools.empty(), "harmony constraint: a required tool call needs tools");
    if (spec_.start == Start::kAfterHeader) return g_.sequence({g_.rule_ref(args_[0]), special("<|call|>")});
    if (spec_.start == Start::kAfterRecipient) {
      std::vector<ExprId> names;
      const std::string prefix = spec_.tool_namespace + ".";
      for (std::size_t i = 0; i < spec_.tools.size(); ++i)
        if (!builtin(spec_.tools[i]))
          names.push_back(g_.sequence({g_.literal(spec_.tools[i].recipient.substr(prefix.size())), call_tail(i)}));
      require(!names.empty(), "harmony constraint: no tool in the '{}' namespace to force a call to", spec_.tool_namespace);
      return g_.choice(names);
    }
    const ExprId text = g_.rule_ref(text_);
    std::vector<ExprId> messages{text_message(spec_.reasoning_channel, "<|end|>", text)};
    if (!spec_.tools.empty()) messages.push_back(text_message(spec_.tool_channel, "<|end|>", text));
    std::vector<ExprId> endings;
    if (!spec_.require_tool_call) {
      const ExprId answer = spec_.final_content ? g_.rule_ref(g_.import(*spec_.final_content, "final.")) : text;
      endings.push_back(text_message(spec_.final_channel, "<|return|>", answer));
    }
    for (std::size_t i = 0; i < spec_.tools.size(); ++i) endings.push_back(call(i));
    const ExprId next_message = g_.sequence({g_.choice(messages), special("<|start|>"), g_.literal("assistant")});
    return g_.sequence({g_.star(next_message), g_.choice(endings)});
  }

  const HarmonyConstraintSpec& spec_;
  Grammar g_;
  RuleId text_ = -1;
  std::vector<RuleId> args_;
};

}  // namespace

uint8_t harmony_byte(std::string_view special_token) {
  const auto* found = std::find(kHarmonyGrammarTokens.begin(), kHarmonyGrammarTokens.end(), special_token);
  require(found != kHarmonyGrammarTokens.end(), "harmony constraint: '{}' is not one of its special tokens",
          special_token);
  return static_cast<uint8_t>(kHarmonyFirstByte + (found - kHarmonyGrammarTokens.begin()));
}

std::string harmony_text_to_grammar_bytes(std::string_view text) {
  std::string out;
  for (std::size_t at = 0; at < text.size();) {
    bool matched = false;
    for (std::string_view token : kHarmonyGrammarTokens) {
      if (text.substr(at).starts_with(token)) {
        out += static_cast<char>(harmony_byte(token));
        at += token.size();
        matched = true;
        break;
      }
    }
    if (!matched) out += text[at++];
  }
  return out;
}

Grammar harmony_grammar(const HarmonyConstraintSpec& spec) { return HarmonyGrammarBuilder(spec).build(); }

std::shared_ptr<const Vocabulary> harmony_vocabulary(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(tokenizer.vocab_size());
  std::vector<TokenId> specials;
  for (TokenId id = 0; id < static_cast<TokenId>(bytes.size()); ++id) {
    if (tokenizer.is_special(id)) {
      specials.push_back(id);
      continue;
    }
    try {
      const std::string_view token = tokenizer.token_bytes(id);
      // Bytes 0xF8..0xFF never occur in UTF-8; a token holding one could pass for a special token's byte.
      if (std::none_of(token.begin(), token.end(), [](char c) { return static_cast<uint8_t>(c) >= kHarmonyFirstByte; }))
        bytes[id] = std::string(token);
    } catch (const std::exception&) {  // a gap in the id space: an empty token never matches
    }
  }
  for (std::string_view token : kHarmonyGrammarTokens) {
    const std::optional<TokenId> id = tokenizer.token_to_id(token);
    require(id.has_value(), "harmony constraint: the tokenizer has no special token {}", token);
    bytes[*id] = std::string(1, static_cast<char>(harmony_byte(token)));
    std::erase(specials, *id);
  }
  return Vocabulary::from_tokens(std::move(bytes), std::move(specials));
}

}  // namespace beamline
