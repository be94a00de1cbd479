#pragma once
// Regular expressions (the ECMAScript subset JSON Schema's `pattern` and vLLM's `regex` use in practice) to
// grammar expressions. Supported: literals, `.`, classes `[...]` / `[^...]` with ranges, `\d \w \s \D \W \S`,
// `\t \n \r \f \v \0 \xHH \uHHHH \u{H...}` and escaped punctuation, groups `(...)`, `(?:...)`, `(?<name>...)`,
// alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms match the same strings), and `^` / `$` at the
// ends of a top-level alternative. Refused by name: backreferences, lookaround, `\b`, `\p{...}`, flags,
// anchors anywhere else.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace beamline {

// Code points as sorted, disjoint, inclusive ranges.
using CodePointSet = std::vector<std::pair<uint32_t, uint32_t>>;
CodePointSet normalize(CodePointSet set);
CodePointSet negate(const CodePointSet& set);  // within [0, 0x10FFFF] without surrogates

enum class RegexEncoding {
  kUtf8,        // the text itself, as UTF-8 bytes
  kJsonString,  // the inside of a JSON string in canonical form (JSON.stringify's escapes, nothing else)
};

// One character of `set` in the given encoding.
ExprId code_points(Grammar& grammar, const CodePointSet& set, RegexEncoding encoding);

// `search`: the pattern may match anywhere (JSON Schema); otherwise it must match the whole string (vLLM).
// Errors are UnsupportedGrammar naming `keyword` (e.g. "pattern") with what in the pattern is refused.
ExprId regex_to_expr(Grammar& grammar, std::string_view pattern, RegexEncoding encoding, bool search,
                     const std::string& keyword);

}  // namespace beamline
