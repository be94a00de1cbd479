#pragma once
// Tools as the model reads them: each namespace becomes a TypeScript-like `namespace { type f = (_: {...})
// => any; }` block rendered from the tools' JSON schemas. The exact form (comments for descriptions,
// titles and examples; `?` for optional fields; `// default:` comments; enums as literal unions; nullable
// as `| null`; oneOf as a multi-line union) is fixed by Harmony's test vectors.
#include <string>

#include "harmony/harmony_message.h"

namespace beamline::harmony {

// "# Tools\n\n## <namespace>\n\n..." for every namespace, in name order.
std::string render_tools_section(const ToolNamespaces& namespaces);
std::string render_tool_namespace(const ToolNamespace& tool_namespace);
// "() => any" or "(_: {...}) => any" for a tool's parameter schema (absent: no arguments).
std::string render_tool_signature(const std::optional<Json>& parameters);

}  // namespace beamline::harmony
