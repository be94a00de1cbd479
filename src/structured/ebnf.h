#pragma once
// EBNF grammars in the GBNF dialect (llama.cpp, XGrammar's EBNF input; vLLM's `grammar` field):
//   root ::= "text" | [a-z0-9_] rule ( "x" | 'y' )* item? item+ item{2,5}   # comment
// Terminals are double- or single-quoted strings (escapes \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH) and
// character classes `[...]` / `[^...]` over code points (UTF-8); `.` is any character. A rule ends where the
// next `name ::=` begins; the start rule is `root`. Left recursion is refused (the matcher reads left to right
// with a stack); lookahead and Lark's syntax are not supported.
#include <string_view>

#include "structured/grammar.h"

namespace beamline {

Grammar ebnf_grammar(std::string_view text, std::string_view root_rule = "root");

}  // namespace beamline
