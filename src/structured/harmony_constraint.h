#pragma once
// The Harmony template as a grammar over an assistant turn's output (what follows `<|start|>assistant`):
//
//   turn    ::= (message <|start|> "assistant")* ending
//   message ::= <|channel|> reasoning <|message|> text <|end|>          (analysis)
//             | <|channel|> tool_channel <|message|> text <|end|>       (a preamble; only when tools are declared)
//   ending  ::= <|channel|> final <|message|> answer <|return|>        (answer: free text, or the response format)
//             | call(T) for a declared tool T
//   call(T) ::= (" to=" T <|channel|> ch | <|channel|> ch " to=" T) content_type <|message|> args(T) <|call|>
//
// where ch is the tool channel (a built-in namespace's tools, e.g. browser.search, may also be called on the
// reasoning channel), content_type is ` <|constrain|>json`, `<|constrain|>json`, ` json`, ` code` or nothing (the
// forms the official vectors and parser accept), and args(T) is T's `parameters` JSON Schema grammar. Text is any
// bytes but Harmony's special tokens.
//
// Harmony's special tokens are grammar bytes 0xF8..0xFE, which never occur in UTF-8 text: harmony_vocabulary()
// gives each of them that one byte and makes every ordinary token holding such a byte (invalid UTF-8) unmatchable,
// so the pushdown matcher and the token masks treat them like text.
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

// In byte order from 0xF8: <|start|> is 0xF8, ..., <|constrain|> is 0xFE.
inline constexpr std::array<std::string_view, 7> kHarmonyGrammarTokens = {
    "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"};
inline constexpr uint8_t kHarmonyFirstByte = 0xF8;

// The grammar byte of one of kHarmonyGrammarTokens (throws for another string).
uint8_t harmony_byte(std::string_view special_token);
// Harmony text with its special tokens written literally (`<|channel|>final<|message|>...`) as grammar bytes.
std::string harmony_text_to_grammar_bytes(std::string_view text);

struct HarmonyTool {
  std::string recipient;                  // "functions.get_weather", "browser.search"
  std::optional<std::string> parameters;  // JSON Schema text of the arguments; none: the tool takes none (`{}`)
};

struct HarmonyConstraintSpec {
  std::string reasoning_channel = "analysis";
  std::string final_channel = "final";
  std::string tool_channel = "commentary";
  std::string tool_namespace = "functions";  // tools outside it are built-ins (also callable on the reasoning channel)
  std::vector<HarmonyTool> tools;            // the only recipients allowed
  // The final answer's content; none: free text. (response_format json_object / json_schema.)
  std::optional<Grammar> final_content;
  enum class Start {
    kTurn,             // the output starts the turn
    kAfterRecipient,   // after a forced call's `<|channel|>{tool_channel} to={tool_namespace}.` (tool_choice required)
    kAfterHeader,      // after the whole header of a call to tools[0], through `<|message|>` (tool_choice named)
  };
  Start start = Start::kTurn;
  bool require_tool_call = false;  // no final answer: the turn ends with a call
};

// Throws UnsupportedGrammar naming the keyword of a tool schema (or the response format) it cannot enforce, or
// Error for a bad spec (a forced start without tools).
Grammar harmony_grammar(const HarmonyConstraintSpec& spec);

// The tokenizer's vocabulary with Harmony's special tokens as their grammar bytes (see above). Throws Error when the
// tokenizer lacks one of them.
std::shared_ptr<const Vocabulary> harmony_vocabulary(const Tokenizer& tokenizer);

}  // namespace beamline
