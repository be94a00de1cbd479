#pragma once
// The request fields that ask for structured output, read into the grammar the engine holds the output to
// (src/structured): OpenAI's `response_format` (`text`, `json_object`, `json_schema` with `schema` and `strict`) and
// vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`), on chat and completions; and for
// chat the Harmony template constraint around them: channels, recipients only among the request's tools, each tool's
// arguments held to its `parameters`, `tool_choice` "required" / named enforced. Compiled grammars come from the
// context's GrammarCache. A keyword the grammar engine cannot enforce is a 400 naming it.
#include <memory>
#include <string>

#include "server/api_error.h"
#include "server/serving_context.h"
#include "structured/token_mask.h"

namespace beamline::server {

// What tool_choice asks for (read by openai_chat).
enum class ToolChoiceMode { Auto, None, Required, Named };
struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::Auto;
  std::string name;  // Named only
};

// The completion's grammar (EOS ends it once complete), or null when the request asks for no structure.
std::shared_ptr<const CompiledGrammar> completion_grammar(const Json& body, const ServingContext& context);

// The assistant turn's grammar: the Harmony template with the request's tools and tool_choice, the final answer held
// to response_format / structured_outputs. Null only when the server runs with --no-harmony-constraint and the request
// asks for no structure (no format, tool_choice auto or none). For tool_choice required / named the prompt already
// ends with the forced call's header (openai_chat's prefill), and the grammar starts after it.
std::shared_ptr<const CompiledGrammar> chat_grammar(const Json& body, const ToolChoice& tool_choice,
                                                    const ServingContext& context);

}  // namespace beamline::server
