#pragma once
// JSON Schema to a grammar for JSON text in one canonical byte form: no whitespace except an optional single
// space after `,` and `:`, strings in JSON.stringify's escaping (raw UTF-8; `\"`, `\\`, `\b \f \n \r \t`,
// `\u00xx` for other control characters), numbers without exponents where a bound or multipleOf applies.
// The grammar is exact for every keyword it accepts; a validation keyword it cannot enforce exactly is
// refused with UnsupportedGrammar naming the keyword (unknown keywords are annotations, as for validators).
//
// Supported: type, enum, const, properties, required, additionalProperties, minProperties / maxProperties
// (objects without declared properties), items (schema or array), prefixItems, additionalItems, minItems,
// maxItems, uniqueItems (false, or arrays of at most one item), minLength, maxLength, pattern, format
// (date, time, date-time, email, ipv4, uuid), minimum, maximum, exclusiveMinimum / exclusiveMaximum (draft 4
// booleans and later numbers), multipleOf (any decimal), allOf, anyOf, oneOf (exact for scalars; objects or
// arrays in two branches only when some branch's objects are unconstrained in all or none), not (exact for
// scalars; objects / arrays only when unconstrained), $ref / definitions / $defs (JSON pointers, ids, known
// remote documents, recursion through objects and arrays), boolean schemas.
#include <map>
#include <string>
#include <string_view>

#include "structured/grammar.h"

namespace beamline {

struct JsonSchemaOptions {
  // Object members in byte order of their names (canonical JSON, e.g. RFC 8785) instead of declared order.
  bool sorted_keys = false;
  // Documents a `$ref` may name by absolute URI (without fragment), as JSON text.
  std::map<std::string, std::string> documents;
};

Grammar json_schema_grammar(std::string_view schema_text, const JsonSchemaOptions& options = {});
// Any JSON value of the given schema-less kind: "object" for response_format json_object, or "any".
Grammar any_json_grammar(std::string_view kind);
// A choice list: exactly one of the strings (vLLM's structured_outputs.choice).
Grammar choice_grammar(const std::vector<std::string>& choices);
// A regular expression over the whole output text (vLLM's structured_outputs.regex).
Grammar regex_grammar(std::string_view pattern);

// The canonical JSON form the grammars accept, for tests: sorted keys, no whitespace.
std::string canonical_json(std::string_view json_text);

}  // namespace beamline
